"""The ``collective`` workload: exact numerics of each op, the refused knobs, exports and the size table."""

from __future__ import annotations

import json
import math

import pytest

from objectives.collective import Collective, nccl_static_check, render_size_table, size_table, size_table_from_db
from tuner.run.gang import run_gang
from tuner.store.storage import StudyDB
from tuner.study.spec import load_spec
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
TUNED = {
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "LL128",
    "NCCL_MIN_NCHANNELS": 4,
    "NCCL_MAX_NCHANNELS": 16,
    "NCCL_BUFFSIZE": 8388608,
    "NCCL_NTHREADS": "default",
}


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_rank_runs_ok_and_a_silent_launch_fails(op: str, dtype: str) -> None:
    w = Collective(op=op, size_bytes=2048, dtype=dtype, world_size=1, iters=3, warmup_iters=1)
    result = w.run(TUNED, DeviceInfo(), TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.metrics["busbw_gbps"] == 0.0  # nccl-tests: (n-1)/n = 0 for one rank
    assert result.metrics["algbw_gbps"] > 0 and len(result.samples_ms) == 3
    assert result.metrics["latency_us"] == pytest.approx(result.metrics["latency_ms"] * 1e3)
    w._launch = lambda config, case: None
    assert w.run(TUNED, DeviceInfo(), TrialContext()).status == TrialStatus.NUMERICS_FAIL


def test_two_ranks_gather_and_scatter_exactly() -> None:
    args = {"op": "reduce_scatter", "size_bytes": 8192, "dtype": "bf16", "world_size": 2, "iters": 3, "warmup_iters": 1}
    out = run_gang("collective", args, TUNED, 2, backend="gloo", trial_timeout_s=60)
    assert out["status"] == "ok", out.get("error")
    assert [r["status"] for r in out["ranks"]] == ["ok", "ok"]
    # reduce_scatter over 2 ranks: busbw = algbw * (n-1)/n
    assert out["metrics"]["busbw_gbps"] == pytest.approx(out["metrics"]["algbw_gbps"] / 2)


def test_a_world_size_the_process_cannot_provide_is_an_error_not_a_hang() -> None:
    result = Collective(world_size=2, size_bytes=4096).run(TUNED, DeviceInfo(), TrialContext())
    assert result.status == TrialStatus.RUNTIME_ERROR and "gpus_per_trial" in result.error


@pytest.mark.parametrize(
    ("config", "op", "needle"),
    [
        ({"NCCL_ALGO": "NVLS"}, "all_reduce", "multicast"),
        ({"NCCL_ALGO": "NVLSTree"}, "all_reduce", "multicast"),
        ({"NCCL_ALGO": "Ring,NVLS"}, "all_reduce", "multicast"),
        ({"NCCL_ALGO": "CollnetDirect"}, "all_reduce", "plugin"),
        ({"NCCL_ALGO": "^Ring"}, "all_reduce", "one of"),
        ({"NCCL_ALGO": "Tree"}, "all_gather", "all_reduce only"),
        ({"NCCL_NVLS_ENABLE": 1}, "all_reduce", "never set"),
        ({"nccl_nvls_enable": "1"}, "all_reduce", "never set"),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, "all_reduce", "never set"),
        ({"NCCL_MIN_NCHANNELS": 16, "NCCL_MAX_NCHANNELS": 4}, "all_reduce", "exceeds"),
        ({"NCCL_BUFFSIZE": 3000000}, "all_reduce", "power of two"),
        ({"NCCL_NTHREADS": 96}, "all_reduce", "NCCL_NTHREADS"),
        ({"NCCL_PROTO": "LL64"}, "all_reduce", "NCCL_PROTO"),
    ],
)
def test_refused_knobs(config: dict, op: str, needle: str) -> None:
    reason = nccl_static_check(config, op)
    assert reason is not None and needle in reason
    w = Collective(op=op, size_bytes=4096, world_size=1)
    assert w.run(config, DeviceInfo(), TrialContext()).status == TrialStatus.INFEASIBLE_STATIC


def test_space_seeds_pass_and_every_point_keeps_multicast_off() -> None:
    w = Collective(size_bytes=2**20)
    space = load_spec(
        {
            "name": "s",
            "workload": "collective",
            "args": {"size_bytes": 2**20},
            "objectives": [{"metric": "busbw_gbps"}],
            "resources": {"gpus_per_trial": 2},
        }
    ).space
    assert all(w.static_check(seed, H200) is None for seed in space.seeds)
    assert not any("NVLS" in str(c) for p in space.params.values() for c in p.choices)
    assert not any(name in ("NCCL_NVLS_ENABLE",) for name in space.params)


def test_benchmark_times_small_messages_over_more_calls() -> None:
    import argparse

    from bench.collective_study import SIZES, iters_for

    args = argparse.Namespace(iters=20)
    counts = {label: iters_for(size, args) for label, size in SIZES.items()}
    assert counts == {"64KiB": 2000, "1MiB": 2000, "16MiB": 358, "256MiB": 23, "1GiB": 20}


def test_export_env_emits_only_the_set_variables() -> None:
    w = Collective(size_bytes=4096, world_size=1)
    assert w.export_env(TUNED) == {
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "LL128",
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "8388608",
    }
    assert w.export_env({k: "default" for k in TUNED}) == {}
    namespace: dict = {}
    exec(compile(w.export_python(TUNED), "<export>", "exec"), namespace)
    assert namespace["os"].environ["NCCL_PROTO"] == "LL128"
    namespace["os"].environ.pop("NCCL_PROTO")  # the exec changed this process's environment
    for key in ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE"):
        namespace["os"].environ.pop(key, None)


def _entry(size: int, algo: str, proto: str, channels: object) -> dict:
    params = {**TUNED, "NCCL_ALGO": algo, "NCCL_PROTO": proto, "NCCL_MAX_NCHANNELS": channels}
    return {
        "study": f"ar-{size}",
        "op": "all_reduce",
        "dtype": "bf16",
        "size_bytes": size,
        "world_size": 2,
        "params": params,
        "metrics": {"busbw_gbps": 1.0},
    }


def test_size_table_ranges_meet_at_geometric_midpoints() -> None:
    rows = size_table(
        [
            _entry(2**20, "Ring", "LL128", 16),
            _entry(2**16, "Ring", "LL", "default"),
            _entry(2**30, "Tree", "default", 32),
        ]
    )
    assert [r["size_bytes"] for r in rows] == [2**16, 2**20, 2**30]
    assert rows[0]["min_bytes"] == 0 and rows[-1]["max_bytes"] == -1
    assert rows[0]["max_bytes"] == 2**18 and rows[1]["min_bytes"] == 2**18 + 1 and rows[1]["max_bytes"] == 2**25
    assert rows[0]["channels"] == -1 and rows[1]["channels"] == 16
    csv = render_size_table(rows, "csv").splitlines()
    assert "allreduce,0,262144,ring,ll,-1,1,2,-1,-1" in csv
    assert "allreduce,262145,33554432,ring,ll128,16,1,2,-1,-1" in csv
    assert any(line.startswith("# allreduce,33554433,-1,tree,default") for line in csv)  # not a rule NCCL reads
    assert json.loads(render_size_table(rows, "json")) == rows


def test_cli_collective_table_from_studies_in_a_database(tmp_path, capsys) -> None:
    from tuner.cli import main

    db = StudyDB(f"sqlite:///{tmp_path / 't.db'}")
    db.create_tables()
    for size, proto in ((65536, "LL"), (16 * 2**20, "Simple")):
        spec = {
            "name": f"ar-{size}",
            "workload": "collective",
            "args": {"size_bytes": size, "world_size": 2, "dtype": "bf16"},
            "objectives": [{"metric": "busbw_gbps"}],
            "resources": {"gpus_per_trial": 2},
        }
        compiled = load_spec(spec)
        row = db.create_study(
            name=spec["name"],
            workload="collective",
            spec=compiled.spec.model_dump(mode="json"),
            space=compiled.space.canonical,
            space_hash=compiled.space.hash,
            status="completed",
        )
        params = {**TUNED, "NCCL_PROTO": proto}
        db.insert_trial(row.id, 0, params, optuna_trial_id=None)
        db.finish_trial(
            row.id,
            0,
            status="ok",
            metrics={"busbw_gbps": 10.0, "algbw_gbps": 10.0, "latency_us": 5.0},
            feasible=True,
            timing_comparable=True,
            error=None,
            worker="w0.0",
            attempt=1,
            fingerprint=None,
        )
    out = tmp_path / "nccl_tuner.conf"
    assert main(["collective-table", "--db", db.url, "--format", "csv", "-o", str(out)]) == 0
    lines = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["allreduce,0,1048576,ring,ll,16,1,2,-1,-1", "allreduce,1048577,-1,ring,simple,16,1,2,-1,-1"]
    assert main(["collective-table", "ar-65536", "--db", db.url]) == 0
    assert [r["size_bytes"] for r in json.loads(capsys.readouterr().out)] == [65536]
    assert main(["collective-table", "nope", "--db", db.url]) == 2
    assert len(size_table_from_db(db)) == 2
    assert all(math.isfinite(r["busbw_gbps"]) for r in size_table_from_db(db))
    db.dispose()
