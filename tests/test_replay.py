"""Landscapes: recording an exhaustive grid, and the ``replay`` workload answering studies from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.landscape import GRIDS, grid_configs, record_landscape
from objectives.replay import Replay, params_key
from tuner.store.storage import StudyDB
from tuner.study.spec import SpecError, load_spec
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

CPU = DeviceInfo()
NOOP_GRID = {"x": [0.1, 0.4, 0.7], "tile": [16, 64, 256], "stages": [1, 3, 6], "mode": ["fast", "balanced"]}
LANDSCAPES = sorted((Path(__file__).resolve().parents[1] / "bench" / "landscapes").glob("*.jsonl"))


@pytest.fixture(scope="module")
def noop_landscape(landscape_dir: Path) -> Path:
    """54 noop configs: trial 5 raises; the 6 past the space's tile budget rule (tile * stages <= 1024)
    are recorded as infeasible_static without running, as a study would prune them."""
    out = landscape_dir / "noop.jsonl"
    counts = record_landscape("noop", {"faults": {"5": "raise"}}, NOOP_GRID, out, compile_threads=2)
    assert counts == {"ok": 47, "infeasible_static": 6, "runtime_error": 1}
    return out


def test_recorded_file_has_header_and_one_record_per_config(noop_landscape: Path) -> None:
    lines = [json.loads(line) for line in noop_landscape.read_text().splitlines()]
    header, records = lines[0], lines[1:]
    assert header["kind"] == "landscape" and header["workload"] == "noop" and header["grid"] == NOOP_GRID
    assert header["configs"] == 54 and {m["name"] for m in header["metrics"]} == {"score", "cost", "latency_ms"}
    assert "python" in header["fingerprint"]
    assert [r["params"] for r in records] == grid_configs(NOOP_GRID)
    pruned = [r for r in records if r["status"] == "infeasible_static"]
    assert all(r["params"]["tile"] * r["params"]["stages"] > 1024 and "tile_budget" in r["error"] for r in pruned)
    assert len(pruned) == 6 and all(not r["samples"] for r in pruned)
    failed = [r for r in records if r["status"] not in ("ok", "infeasible_static")]
    assert len(failed) == 1 and failed[0]["params"] == grid_configs(NOOP_GRID)[5]
    assert "injected failure in trial 5" in failed[0]["error"]
    ok = records[0]
    assert ok["samples"] and ok["metrics"]["score"] == pytest.approx(
        1.0 - (0.1 - 0.7) ** 2 - (4 - 6) ** 2 / 8 - (1 - 3) ** 2 / 9 - 0.15
    )


def test_replay_answers_recorded_params_and_refuses_unknown(noop_landscape: Path) -> None:
    replay = Replay(file=str(noop_landscape))
    assert [m.name for m in replay.metric_specs()] == ["score", "cost", "latency_ms"]
    seeded = Replay(file=str(noop_landscape), seeds=[{"x": 0.7, "tile": 64, "stages": 3, "mode": "balanced"}])
    assert seeded.space_document()["seeds"] == [{"x": 0.7, "tile": 64, "stages": 3, "mode": "balanced"}]
    config = {"x": 0.7, "tile": 64, "stages": 3, "mode": "balanced"}
    result = replay.run(config, CPU, TrialContext())
    assert result.status == TrialStatus.OK and result.metrics["score"] == pytest.approx(1.0)
    assert result.samples_ms and result.timing_comparable is False  # recorded on a CPU
    failed = replay.run(grid_configs(NOOP_GRID)[5], CPU, TrialContext())
    assert failed.status == TrialStatus.RUNTIME_ERROR and "injected failure" in (failed.error or "")
    unknown = {"x": 0.5, "tile": 64, "stages": 3, "mode": "balanced"}
    assert replay.static_check(unknown, CPU) == "config not in the recorded landscape"
    assert replay.run(unknown, CPU, TrialContext()).status == TrialStatus.INFEASIBLE_STATIC


def test_replay_args_and_bad_files_are_refused_naming_the_field(landscape_dir: Path) -> None:
    with pytest.raises(ValueError, match="file"):
        Replay(file=str(landscape_dir / "missing.jsonl"))
    with pytest.raises(ValueError, match="seeds"):
        Replay(file=str(LANDSCAPES[0]) if LANDSCAPES else "x", seeds={"BLOCK_M": 64})
    bad = landscape_dir / "bad.jsonl"
    bad.write_text('{"kind": "something else"}\n')
    with pytest.raises(ValueError, match="header"):
        Replay(file=str(bad))
    bad.write_text(
        json.dumps({"kind": "landscape", "format": 1, "grid": {"a": [1]}, "metrics": [{"name": "m"}]})
        + '\n{"params": {"a": 1}, "status": "exploded"}\n'
    )
    with pytest.raises(ValueError, match="exploded"):
        Replay(file=str(bad))
    with pytest.raises(SpecError) as info:
        load_spec({"name": "r", "workload": "replay", "args": {"file": "nope.jsonl"}, "objectives": [{"metric": "x"}]})
    assert ("args" in [field for field, _ in info.value.errors]) and "nope.jsonl" in str(info.value)


def test_replay_files_are_confined_to_the_landscape_directories(
    noop_landscape: Path, landscape_dir: Path, tmp_path: Path
) -> None:
    """Only ``.jsonl`` files inside bench/landscapes/ or $TUNER_LANDSCAPE_DIR are read; everything else gets
    one message, which does not tell whether the file exists (``/etc/shadow`` answered "...:1 is not JSON")."""
    outside = tmp_path / "outside.jsonl"
    outside.write_text(noop_landscape.read_text())  # a valid landscape, in the wrong place
    (landscape_dir / "link-out.jsonl").symlink_to(outside)
    (landscape_dir / "link-etc.jsonl").symlink_to("/etc/passwd")
    refused = [
        str(outside),
        "/etc/passwd",
        "/etc/shadow",
        "/proc/self/environ",
        "/no/such/dir/x.jsonl",
        str(landscape_dir / "missing.jsonl"),
        str(landscape_dir / ".." / landscape_dir.name / noop_landscape.name),
        f"../{landscape_dir.name}/{noop_landscape.name}",
        "~root/x.jsonl",
        "~nosuchuser/x",
        str(landscape_dir / "link-out.jsonl"),
        "link-etc.jsonl",
        str(landscape_dir),
    ]
    messages = set()
    for file in refused:
        with pytest.raises(ValueError) as info:
            Replay(file=file)
        messages.add(str(info.value).replace(repr(file), "FILE"))
    assert len(messages) == 1 and "TUNER_LANDSCAPE_DIR" in messages.pop()
    with pytest.raises(SpecError) as spec_error:
        load_spec({"name": "r", "workload": "replay", "args": {"file": "/etc/passwd"}, "objectives": [{"metric": "x"}]})
    assert "args" in [field for field, _ in spec_error.value.errors] and "not JSON" not in str(spec_error.value)
    # inside: by absolute path, by name relative to the directory, through a symlink that stays inside
    (landscape_dir / "link-in.jsonl").symlink_to(noop_landscape)
    for file in (str(noop_landscape), noop_landscape.name, "link-in.jsonl"):
        assert len(Replay(file=file).landscape.records) == 54
    if LANDSCAPES:  # the project's own, relative to the repository
        assert Replay(file=f"bench/landscapes/{LANDSCAPES[0].name}").landscape.records


def test_a_replay_study_runs_on_the_engine_and_finds_the_recorded_best(
    noop_landscape: Path, tmp_path: Path, ray_session: None
) -> None:
    from tuner.run.orchestrator import Orchestrator

    spec = {
        "name": "replay-noop",
        "workload": "replay",
        "args": {"file": str(noop_landscape)},
        "objectives": [{"metric": "score"}],
        "budget": {"trials": 54},
        "sampler": "grid",
        "resources": {"workers": 2},
    }
    compiled = load_spec(spec)
    assert compiled.space.size() == 54 and compiled.directions == ["maximize"]
    db = StudyDB(str(tmp_path / "replay.db"))
    summary = Orchestrator(compiled, db).run()
    trials = db.trials(summary.study_id)
    assert summary.counts == {"ok": 47, "infeasible_static": 6, "runtime_error": 1}
    assert summary.best is not None and summary.best.metrics["score"] == pytest.approx(1.0)
    assert summary.best.params == {"x": 0.7, "tile": 64, "stages": 3, "mode": "balanced"}
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 54


@pytest.mark.parametrize("path", LANDSCAPES, ids=[p.name for p in LANDSCAPES])
def test_committed_landscapes_are_complete_and_replayable(path: Path) -> None:
    """Every committed landscape: a GPU fingerprint, >= 300 configs, each grid config once (all of them, unless
    a time limit cut the recording), replayable."""
    replay = Replay(file=str(path))
    header = replay.landscape.header
    assert replay.landscape.on_gpu, "landscapes are recorded on a GPU"
    configs = grid_configs(header["grid"], header.get("when"))
    # a grid recorded within a time limit holds a random subset of its configs, and says how many
    expected = header.get("configs_recorded", len(configs))
    assert expected >= 300 and len(replay.landscape.records) == expected
    assert set(replay.landscape.records) <= {params_key(c) for c in configs}
    statuses = {r["status"] for r in replay.landscape.records.values()}
    assert "ok" in statuses
    load_spec(
        {
            "name": "r",
            "workload": "replay",
            "args": {"file": str(path)},
            "objectives": [{"metric": header["metrics"][0]["name"]}],
        }
    )


@pytest.mark.parametrize("family", sorted(GRIDS))
def test_every_family_grid_has_300_configs_over_the_workload_knobs(family: str) -> None:
    """The grids bench/landscape.py records: >= 300 configs, each a full config of the workload's space."""
    from tuner.study.space import compile_space
    from tuner.workloads.registry import workload_class

    grid = GRIDS[family]
    workload = workload_class(grid["workload"])(**grid["args"])
    space = compile_space(workload.space_document())
    configs = grid_configs(grid["grid"], grid.get("when"))
    assert len(configs) >= 300
    assert set(grid["grid"]) <= set(space.params)
    assert all(space.params[name].when is not None for name in grid.get("when", {}))
    assert all(
        value in (space.params[name].values() or [value]) for name, values in grid["grid"].items() for value in values
    )


def test_grid_axes_keep_their_order_as_pow2_or_int_params() -> None:
    from objectives.replay import grid_param

    assert grid_param([64, 128, 256]) == {"type": "pow2", "low": 64, "high": 256}
    assert grid_param([3, 4, 5]) == {"type": "int", "low": 3, "high": 5}
    for values in ([16, 64, 256], [1, 4, 8, 16], [8], ["bf16", "fp16"], [False, True], [0.1, 0.4]):
        assert grid_param(values) == {"type": "categorical", "choices": values}


def test_a_conditional_grid_records_each_config_once_and_replays_with_its_conditions(landscape_dir: Path) -> None:
    """``when``: depth exists only for mode 'exact'; the replay space carries the condition, and a study of the
    project's strategy measures every recorded config once."""
    from tuner.strategy import SpaceExhausted, TunerSampler
    from tuner.study.space import compile_space

    grid = {"x": [0.5], "tile": [16, 64], "stages": [1, 3], "mode": ["balanced", "exact"], "depth": [8, 16]}
    when = {"depth": "mode == 'exact'"}
    configs = grid_configs(grid, when)
    assert len(configs) == 12 and all(("depth" in c) == (c["mode"] == "exact") for c in configs)
    out = landscape_dir / "noop-conditional.jsonl"
    counts = record_landscape("noop", {}, grid, out, compile_threads=1, when=when, order_seed=3)
    assert counts == {"ok": 12}
    replay = Replay(file=str(out))
    space = compile_space(replay.space_document())
    assert space.params["depth"].when is not None and replay.static_check(configs[0], CPU) is None
    sampler = TunerSampler(space, seed=0, static_check=lambda c: replay.static_check(c, CPU))
    study = __import__("optuna").create_study(direction="maximize", sampler=sampler)
    seen = set()
    for _ in range(12):
        trial = study.ask()
        config = space.suggest(trial)
        seen.add(params_key(config))
        study.tell(trial, replay.run(config, CPU, TrialContext()).metrics["score"])
    assert seen == {params_key(c) for c in configs}
    with pytest.raises(SpaceExhausted):
        space.suggest(study.ask())


def test_a_time_limit_records_a_prefix_and_says_so_in_the_header(landscape_dir: Path) -> None:
    out = landscape_dir / "noop-limited.jsonl"
    record_landscape("noop", {}, NOOP_GRID, out, compile_threads=1, order_seed=0, time_limit_s=0.0)
    header = json.loads(out.read_text().splitlines()[0])
    assert header["configs"] == 54 and header["configs_recorded"] < 54 and "time limit" in header["truncated"]


@pytest.mark.timeout(30)
def test_replay_benchmark_gives_its_quantiles_a_bootstrap_interval() -> None:
    """The replay benchmark's p90 and median of trials-to-2% come with a 95% interval over resampled seeds:
    reproducible, containing the point estimate, open (None) above where a quantile lies past the budget."""
    from bench.replay_search import bootstrap_interval, quantile

    needed = [3, 5, 7, 8, 9, 10, 12, 15, 16, 40]
    low, high = bootstrap_interval(needed, 0.9)
    assert low is not None and high is not None and low <= quantile(needed, 0.9) <= high
    assert bootstrap_interval(needed, 0.9) == [low, high]  # a fixed generator: the same interval again
    assert bootstrap_interval([5] * 10, 0.5) == [5, 5]
    assert bootstrap_interval([4, None, None, None], 0.9) == [None, None]
