"""The ``ddp_step`` workload: DDP training steps of the tiny GPT on one rank and on a gang of two gloo ranks."""

from __future__ import annotations

import math

import pytest

from objectives.ddp_step import DDPStep
from tuner.run.gang import run_gang
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
BASE = {
    "bucket_cap_mb": 1,
    "gradient_as_bucket_view": True,
    "static_graph": True,
    "comm_hook": "none",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "default",
}


def test_one_rank_trains_and_a_silent_launch_fails() -> None:
    w = DDPStep(world_size=1, steps=2, warmup_steps=1)
    result = w.run(BASE, DeviceInfo(), TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.metrics["loss_delta"] == 0.0 and result.metrics["step_ms"] > 0
    assert result.metrics["tokens_per_s"] == pytest.approx(2 * 32 / (result.metrics["step_ms"] * 1e-3))
    assert math.isfinite(result.extra["final_loss"])
    w._launch = lambda config, case: None
    assert w.run(BASE, DeviceInfo(), TrialContext()).status == TrialStatus.NUMERICS_FAIL


def test_two_ranks_with_fp16_compression_stay_close_to_the_uncompressed_loss() -> None:
    args = {"world_size": 2, "steps": 2, "warmup_steps": 1}
    out = run_gang(
        "ddp_step", args, {**BASE, "comm_hook": "fp16", "static_graph": False}, 2, backend="gloo", trial_timeout_s=60
    )
    assert out["status"] == "ok", out.get("error")
    assert [r["status"] for r in out["ranks"]] == ["ok", "ok"]
    # fp16 gradients of a tiny model after 3 AdamW steps: the loss moves by far less than 1e-2 nats
    assert out["metrics"]["loss_delta"] != 0.0 and abs(out["metrics"]["loss_delta"]) < 1e-2


def test_static_checks() -> None:
    w = DDPStep(world_size=2)
    assert "bf16" in w.static_check({**BASE, "comm_hook": "bf16"}, DeviceInfo())
    assert w.static_check({**BASE, "comm_hook": "bf16"}, H200) is None
    assert "multicast" in w.static_check({**BASE, "NCCL_ALGO": "NVLS"}, H200)
    assert "never set" in w.static_check({**BASE, "NCCL_NVLS_ENABLE": "1"}, H200)
    assert "lacks" in w.static_check({"bucket_cap_mb": 25}, H200)
    # DDP's construction broadcasts and all-gathers: NCCL has no Tree for those (a runtime error on the H200).
    assert "Tree" in w.static_check({**BASE, "NCCL_ALGO": "Tree"}, H200)
    assert w.export_env({**BASE, "NCCL_PROTO": "Simple"}) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    assert w.export_config(BASE)["ddp"] == {"bucket_cap_mb": 1, "gradient_as_bucket_view": True, "static_graph": True}
    compile(w.export_python({**BASE, "comm_hook": "bf16"}), "<export>", "exec")
