"""The best-config registry on SQLite and PostgreSQL: publish, exact and nearest lookup, retract, the
automatic publication of a completed study, the fingerprint watch and a recheck that flags a regression."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import pytest
from sqlalchemy import update

from tuner.best_configs import answers
from tuner.best_configs import registry as configs
from tuner.best_configs.recheck import recheck
from tuner.best_configs.registry import ConfigEntryRow, RegistryError
from tuner.run.orchestrator import Orchestrator
from tuner.store.storage import StudyDB
from tuner.study.spec import load_spec
from tuner.workloads.fingerprint import fingerprint

pytestmark = pytest.mark.timeout(300)

H200 = {"kind": "cuda", "name": "NVIDIA H200"}
CPU = {"kind": "cpu", "name": "x86_64"}
GPU_SOFTWARE = {"driver": "580.1", "cuda": "12.8", "torch": "2.11.0", "triton": "3.6.0", "nccl": "2.27.3"}
TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def gemm_config(**changes: Any) -> dict[str, Any]:
    return {**TILE, "precision": "fp16", "pad_k": False, "kernel": "tutorial", **changes}


def measured_study(
    db: StudyDB,
    name: str,
    args: dict[str, Any],
    trials: list[tuple[dict[str, Any], float]],
    *,
    workload: str = "triton_gemm",
    metric: str = "tflops",
    device: dict[str, Any] = H200,
    software: dict[str, Any] = GPU_SOFTWARE,
) -> int:
    """A completed study whose trials measured ``(config, figure)``, written through the storage layer."""
    spec = {"name": name, "workload": workload, "args": args, "objectives": [{"metric": metric}]}
    row = db.create_study(
        name=name, workload=workload, spec=spec, space={}, space_hash="h", objectives=[(metric, "maximize")]
    )
    db.update_study(row.id, status="completed", device=device, fingerprint=software)
    comparable = device["kind"] == "cuda"
    timing = {"median_ms": 1.0, "ci95_ms": [0.98, 1.02], "reps": 40}
    for number, (config, value) in enumerate(trials):
        db.insert_trial(row.id, number, config, optuna_trial_id=None)
        db.finish_trial(
            row.id,
            number,
            status="ok",
            metrics={metric: value},
            extra={"timing": timing},
            feasible=True,
            timing_comparable=comparable,
            error=None,
            worker="w0",
            attempt=1,
            fingerprint=software,
        )
    return row.id


def shapes(found: configs.Lookup) -> list[tuple[int, int, int]]:
    return [(m.entry.shape["m"], m.entry.shape["n"], m.entry.shape["k"]) for m in found.matches]


def test_publish_then_exact_and_nearest_lookup_then_retract(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    for size, value in ((1024, 100.0), (4096, 400.0), (16384, 700.0)):
        args = {"m": size, "n": size, "k": size}
        study = measured_study(db, f"gemm-{size}", args, [(gemm_config(BLOCK_M=64), value / 2), (gemm_config(), value)])
        published = configs.publish(db, study)
        assert published.action == "added"
        entry = published.entry
        assert entry.shape == args and entry.fixed == {"precision": "fp16", "timing": "eager"}
        assert entry.gpu == "NVIDIA H200"
        assert entry.comparable and entry.status == "ok" and entry.trial_number == 1 and entry.value == value
        assert entry.interval["source"] == "timing" and entry.interval["low"] < value < entry.interval["high"]
        assert entry.exported["kwargs"]["BLOCK_M"] == 128 and entry.exported["num_warps"] == 8
    # A CPU study of the same shape is kept, not comparable, and never served for a GPU lookup.
    cpu_study = measured_study(
        db, "gemm-4096-cpu", {"m": 4096, "n": 4096, "k": 4096}, [(gemm_config(BLOCK_M=32), 0.01)], device=CPU
    )
    cpu_entry = configs.publish(db, cpu_study).entry
    assert cpu_entry.gpu == "cpu" and not cpu_entry.comparable

    exact = configs.lookup(db, "triton_gemm", {"m": "4096", "n": "4096", "k": "4096"}, gpu="NVIDIA H200")
    assert exact.exact and exact.matches[0].distance == 0.0 and exact.matches[0].entry.value == 400.0
    any_gpu = configs.lookup(db, "triton_gemm", {"m": 4096, "n": 4096, "k": 4096})
    assert any_gpu.matches[0].entry.gpu == "NVIDIA H200"
    on_cpu = configs.lookup(db, "triton_gemm", {"m": 4096, "n": 4096, "k": 4096}, gpu="cpu")
    assert on_cpu.exact and on_cpu.matches[0].entry.id == cpu_entry.id

    near = configs.lookup(db, "triton_gemm", {"m": 6144, "n": 6144, "k": 6144}, gpu="NVIDIA H200", k=3)
    assert not near.exact
    assert shapes(near) == [(4096, 4096, 4096), (16384, 16384, 16384)]  # 1024 is beyond the bound
    log2_ratio = math.log2(6144 / 4096)
    assert near.matches[0].distance == pytest.approx(3**0.5 * log2_ratio)
    assert answers.lookup_dict(near)["matches"][1]["distance"] == pytest.approx(3**0.5 * math.log2(16384 / 6144))

    with pytest.raises(RegistryError, match="no triton_gemm entry on NVIDIA A100"):
        configs.lookup(db, "triton_gemm", {"m": 4096, "n": 4096, "k": 4096}, gpu="NVIDIA A100")
    with pytest.raises(RegistryError, match="shape needs k"):
        configs.lookup(db, "triton_gemm", {"m": 4096, "n": 4096})
    with pytest.raises(RegistryError, match=re.escape('with {"precision":"bf16"}')):
        configs.lookup(db, "triton_gemm", {"m": 4096, "n": 4096, "k": 4096}, fixed={"precision": "bf16"})

    assert configs.retract(db, exact.matches[0].entry.id) and not configs.retract(db, exact.matches[0].entry.id)
    after = configs.lookup(db, "triton_gemm", {"m": 4096, "n": 4096, "k": 4096}, gpu="NVIDIA H200", k=2)
    assert not after.exact and sorted(shapes(after)) == [(1024, 1024, 1024), (16384, 16384, 16384)]  # tied at 2*sqrt(3)
    total, page = configs.list_entries(db, workload="triton_gemm", shape={"m": "16384"})
    assert total == 1 and page[0].value == 700.0
    db.dispose()


def test_a_worse_study_keeps_the_entry_and_new_software_marks_the_old_unverified(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    args = {"m": 2048, "n": 2048, "k": 2048}
    first = configs.publish(db, measured_study(db, "good", args, [(gemm_config(), 300.0)]), force=False)
    worse = configs.publish(db, measured_study(db, "worse", args, [(gemm_config(BLOCK_N=64), 200.0)]), force=False)
    assert worse.action == "kept" and worse.entry.id == first.entry.id and worse.entry.study_name == "good"
    by_hand = configs.publish(db, "worse", trial=0)  # a publish by hand replaces
    assert by_hand.action == "replaced" and by_hand.entry.study_name == "worse"

    newer = {**GPU_SOFTWARE, "driver": "590.2"}
    other = configs.publish(db, measured_study(db, "new-driver", args, [(gemm_config(), 310.0)], software=newer))
    assert other.action == "added" and other.unverified == [first.entry.id]
    assert configs.get_entry(db, first.entry.id).status == "unverified"
    found = configs.lookup(db, "triton_gemm", args, gpu="NVIDIA H200", k=3)
    assert [m.entry.id for m in found.matches] == [other.entry.id]  # one per shape: the verified one
    db.dispose()


def noop_study(name: str, **changes: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "workload": "noop",
        "space": {"tile": {"high": 128}, "stages": {"high": 4}},
        "objectives": [{"metric": "score"}],
        "budget": {"trials": 6, "trial_timeout_s": 30},
        "remeasure": {"top_k": 2, "rounds": 2},
        "seed": 3,
    }
    spec.update(changes)
    return spec


@pytest.mark.usefixtures("ray_session")
def test_a_completed_study_publishes_its_pick_and_a_recheck_flags_a_regression(db_url: str) -> None:
    db = StudyDB(db_url)
    summary = Orchestrator(load_spec(noop_study("noop-published")), db, workers=1).run()
    Orchestrator(load_spec(noop_study("noop-unpublished", publish=False, seed=4)), db, workers=1).run()
    total, (entry,) = configs.list_entries(db, workload="noop")
    assert total == 1 and entry.study_name == "noop-published" and entry.trial_number == summary.best.number
    assert entry.gpu == "cpu" and not entry.comparable and entry.config == summary.best.params
    assert entry.interval["source"] == "remeasured" and entry.interval["n"] >= 2

    # Measured again on the same software: the same figure, still ok.
    (same,) = recheck(db, workload="noop", rounds=2)
    assert same.verdict == "ok" and configs.get_entry(db, entry.id).recheck["interval"]["high"] == entry.value

    with pytest.raises(ValueError, match="key entries"):
        recheck(db, workload="noop", args_override={"not_a_run_setting": 1})
    # noop's drift knob lowers every score: the new interval lies below the old one.
    (flagged,) = recheck(db, workload="noop", rounds=2, args_override={"drift": 0.25})
    stored = configs.get_entry(db, entry.id)
    assert flagged.verdict == "regressed" and stored.status == "regressed"
    assert stored.recheck["previous"]["low"] == pytest.approx(entry.interval["low"])
    assert stored.recheck["interval"]["high"] == pytest.approx(entry.value - 0.25)

    # Other software (an older torch) than this machine runs: unverified until a recheck passes.
    with db.Session.begin() as s:
        s.execute(
            update(ConfigEntryRow)
            .where(ConfigEntryRow.id == entry.id)
            .values(status="ok", fingerprint={**entry.fingerprint, "torch": "0.1"}, software_key="older")
        )
    assert configs.mark_unverified(db, "cpu", fingerprint()) == [entry.id]
    assert configs.get_entry(db, entry.id).status == "unverified"
    (verified,) = recheck(db, workload="noop", rounds=1)
    stored = configs.get_entry(db, entry.id)
    assert verified.verdict == "ok" and stored.status == "ok"
    assert stored.software_key == configs.software_key(fingerprint())
    assert dt.datetime.fromisoformat(stored.recheck["checked_at"]).tzinfo is not None
    db.dispose()


@pytest.mark.usefixtures("ray_session", "interpreter")
def test_warm_start_from_the_registry_enqueues_the_nearest_shapes_configs_first(db_url: str) -> None:
    db = StudyDB(db_url)
    db.create_tables()
    near = {"BLOCK": 256, "num_warps": 2, "precision": "fp32"}
    farther = {"BLOCK": 512, "num_warps": 4, "precision": "fp32"}
    entries = {}
    for n, config in ((1024, near), (8192, farther), (2**20, {"BLOCK": 2048, "num_warps": 8, "precision": "fp32"})):
        study = measured_study(db, f"axpy-{n}", {"n": n}, [(config, 1.0)], workload="axpy", metric="gbps", device=CPU)
        entries[n] = configs.publish(db, study).entry.id
    spec = {
        "name": "axpy-2048-warm",
        "workload": "axpy",
        "args": {"n": 2048},
        "objectives": [{"metric": "gbps"}],
        "budget": {"trials": 8, "trial_timeout_s": 60},
        "warm_start": "registry",
        "warm_start_k": 3,
        "seed": 0,
    }
    summary = Orchestrator(load_spec(spec), db, workers=1).run()
    trials = sorted(db.trials(summary.study_id), key=lambda t: t.number)
    assert [trials[0].params, trials[1].params] == [near, farther]  # nearest first; 2**20 is beyond the bound
    origins = configs.trial_origins(db, summary.study_id)
    assert origins[0]["source"] == "registry" and origins[0]["entry"] == entries[1024]
    assert origins[0]["distance"] == pytest.approx(1.0) and origins[1]["distance"] == pytest.approx(2.0)
    assert set(origins) == {0, 1}  # warm-start trials take 8 // 4 of the budget: the space's seeds had no room
    # The study's own pick is published beside them at its shape.
    assert configs.lookup(db, "axpy", {"n": 2048}, gpu="cpu").exact
    db.dispose()
