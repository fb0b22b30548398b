"""The ``train_step`` workload (objectives/train_step.py) on the CPU with the tiny GPT, and on a GPU when there is one.

CPU: argument validation, the space and its seeds, static refusals, the numerics of every precision
the CPU runs (fp32, bf16 and fp16 autocast) against the fp32 reference, checkpointing and gradient
accumulation leaving the loss unchanged, the simulated and the raised OOM, failure statuses, and a
short study through the engine (Ray worker, Optuna, SQLite) that is then resumed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest

from models.config import PRESETS
from objectives.train_step import LEAK_TOLERANCE_BYTES, TrainStep, estimate_peak_bytes, fp8_mixed_peak
from tuner.study.space import compile_space
from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus

torch = pytest.importorskip("torch")

CPU = DeviceInfo()
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
A100 = DeviceInfo(kind="cuda", name="NVIDIA A100", compute_capability=(8, 0), smem_per_block_bytes=166912)
T4 = DeviceInfo(kind="cuda", name="Tesla T4", compute_capability=(7, 5), smem_per_block_bytes=65536)
BASE = {"precision": "fp32", "checkpoint": 0, "compile": "off", "attention": "sdpa", "optimizer": "adamw_foreach"}
METRICS = ("tokens_per_s", "mfu", "peak_mem_gb", "loss_delta", "loss_error", "step_ms")


def _config(micro: int = 2, **changes: Any) -> dict[str, Any]:
    return {**BASE, "micro_batch": micro, **changes}


def _run(workload: TrainStep, config: dict[str, Any]):
    return workload.run(config, CPU, TrialContext())


@pytest.fixture(scope="module")
def tiny() -> TrainStep:
    """global batch 4, 1 warm-up + 3 timed steps; its fp32 reference is computed once for the module."""
    return TrainStep(model="tiny", global_batch=4, steps=3, warmup_steps=1, seed=0)


# --------------------------------------------------------------------------- args, space, static checks


def test_args_are_validated_naming_the_arg() -> None:
    for args, name in (
        ({"model": "huge"}, "model"),
        ({"model": {"vocab_size": 10, "n_layers": 1, "d_model": 30, "n_heads": 4, "seq_len": 8}}, "n_heads"),
        ({"model": {"vocab_size": 10, "width": 3}}, "model"),
        ({"global_batch": 0}, "global_batch"),
        ({"steps": 0}, "steps"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"seed": "x"}, "seed"),
        ({"reference_steps": 9}, "reference_steps"),
        ({"memory_limit_gb": -1.0}, "memory_limit_gb"),
        ({"lr": 0}, "lr"),
    ):
        with pytest.raises(ValueError, match=name):
            TrainStep(**args)
    with pytest.raises(TypeError):
        TrainStep(no_such_arg=1)
    custom = TrainStep(model={"vocab_size": 64, "n_layers": 1, "d_model": 32, "n_heads": 2, "seq_len": 16})
    assert custom.cfg.d_model == 32 and custom.reference_steps == 7


@pytest.mark.parametrize("global_batch", [None, 8, 16])
def test_space_and_seeds_pass_static_check_on_an_h200(global_batch: int | None, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    workload = TrainStep(model="1b", global_batch=global_batch)
    space = compile_space(workload.space_document())
    assert ("grad_accum" in space.params) == (global_batch is None)
    assert len(space.seeds) >= 4
    default = space.seeds[0]
    assert (default["precision"], default["micro_batch"], default["compile"]) == ("fp32", 1, "off")
    for seed in space.seeds:
        assert space.static_violation(seed, H200.to_dict()) is None, seed
        assert workload.static_check(seed, H200) is None, seed
        assert ("grad_accum" in seed) == (global_batch is None)


def test_static_check_refusals() -> None:
    w = TrainStep(model="tiny", global_batch=8)
    assert "CUDA GPU" in w.static_check(_config(attention="triton"), CPU)
    assert "fp16/bf16" in w.static_check(_config(attention="triton"), H200)  # fp32
    assert w.static_check(_config(attention="triton", precision="bf16"), H200) is None
    odd_heads = TrainStep(model={**PRESETS["tiny"].to_dict(), "d_model": 96, "n_heads": 2}, global_batch=8)
    assert "power of two" in odd_heads.static_check(_config(attention="triton", precision="bf16"), H200)
    assert "divide" in w.static_check(_config(micro=3), CPU)
    assert "contradicts" in w.static_check(_config(micro=2, grad_accum=2), CPU)
    assert w.static_check(_config(micro=2, grad_accum=4), CPU) is None
    assert "lacks" in w.static_check({"micro_batch": 2}, CPU)
    assert "GPU" in w.static_check(_config(compile="default"), CPU)
    assert "fp8" in w.static_check(_config(precision="fp8"), CPU)
    assert "tf32" in w.static_check(_config(precision="tf32"), CPU)
    assert "CUDA" in w.static_check(_config(attention="sdpa_efficient"), CPU)
    assert "fp16/bf16" in w.static_check(_config(attention="sdpa_flash"), H200)
    assert w.static_check(_config(attention="sdpa_flash"), CPU) is None  # the CPU flash kernel takes fp32
    assert "8.9" in w.static_check(_config(precision="fp8"), A100)
    assert w.static_check(_config(precision="fp8", compile="max-autotune-no-cudagraphs"), H200) is None
    assert "8.0" in w.static_check(_config(precision="bf16"), T4)
    assert "checkpoint" in w.static_check(_config(checkpoint=-1), CPU)
    free = TrainStep(model="tiny")
    assert "grad_accum" in free.static_check(_config(), CPU)
    assert free.static_check(_config(grad_accum=16), CPU) is None
    odd = TrainStep(model={"vocab_size": 64, "n_layers": 1, "d_model": 24, "n_heads": 2, "seq_len": 10}, global_batch=1)
    assert "16" in odd.static_check(_config(micro=1, precision="fp8"), H200)
    cold = TrainStep(model="tiny", global_batch=8, warmup_steps=0)
    assert "warmup" in cold.static_check(_config(compile="default"), H200)


def test_static_check_needs_no_torch() -> None:
    code = (
        "import sys\n"
        "from objectives.train_step import TrainStep\n"
        "from tuner.workloads.base import DeviceInfo\n"
        "w = TrainStep(model='1b', global_batch=8)\n"
        "dev = DeviceInfo(kind='cuda', name='NVIDIA H200', compute_capability=(9, 0))\n"
        "assert w.static_check({'micro_batch': 8, 'precision': 'fp8', 'checkpoint': 0, 'compile': 'default',"
        " 'attention': 'sdpa_flash', 'optimizer': 'adamw_fused'}, dev) is None\n"
        "w.space_document(); w.work({'micro_batch': 8, 'precision': 'bf16'})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_infeasible_config_is_not_launched(tiny: TrainStep, monkeypatch) -> None:
    monkeypatch.setattr(tiny, "_case", lambda *a, **k: pytest.fail("built a model for an infeasible config"))
    result = _run(tiny, _config(attention="triton"))
    assert result.status == TrialStatus.INFEASIBLE_STATIC and "CUDA GPU" in result.error


# --------------------------------------------------------------------------- numerics and metrics


@pytest.mark.parametrize(("precision", "bound"), [("fp32", 1e-4), ("bf16", 0.02), ("fp16", 0.02)])
def test_every_cpu_precision_trains_close_to_the_fp32_reference(tiny: TrainStep, precision: str, bound: float) -> None:
    result = _run(tiny, _config(precision=precision))
    assert result.status == TrialStatus.OK, result.error
    for metric in METRICS:
        assert math.isfinite(result.metrics[metric]), metric
    assert result.metrics["mfu"] == 0.0  # no peak known for a CPU
    assert result.metrics["tokens_per_s"] > 0 and result.metrics["peak_mem_gb"] > 0
    assert len(result.samples_ms) == 3 and all(s > 0 for s in result.samples_ms)
    assert result.timing_comparable is False
    losses, ref = result.extra["losses"], result.extra["reference_losses"]
    assert len(losses) == len(ref) == 4
    assert losses[-1] < losses[0] - 0.05, losses  # it learns (targets = 7 * token + 3)
    assert abs(ref[0] - math.log(256)) < 0.2  # the untrained model is near uniform
    assert abs(result.metrics["loss_delta"]) < bound
    assert result.metrics["loss_delta"] == pytest.approx(losses[-1] - ref[-1])
    assert result.metrics["loss_error"] == abs(result.metrics["loss_delta"])
    assert result.metrics["step_ms"] == pytest.approx(sorted(result.samples_ms)[1])
    assert result.metrics["tokens_per_s"] == pytest.approx(4 * 32 / (result.metrics["step_ms"] * 1e-3))


def test_the_reference_is_computed_once(tiny: TrainStep, monkeypatch) -> None:
    _run(tiny, _config())
    assert set(tiny._references) == {("cpu", 4)}
    monkeypatch.setattr(tiny, "_build", lambda *a, **k: pytest.fail("recomputed"), raising=True)
    assert tiny._reference_losses(4, torch.device("cpu")) == tiny._references[("cpu", 4)]


def test_checkpointing_and_attention_modes_leave_the_loss_unchanged(tiny: TrainStep) -> None:
    plain = _run(tiny, _config())
    for changes in ({"checkpoint": 1}, {"checkpoint": 2}, {"attention": "math"}, {"attention": "sdpa_flash"}):
        other = _run(tiny, _config(**changes))
        assert other.status == TrialStatus.OK, (changes, other.error)
        assert other.extra["losses"] == pytest.approx(plain.extra["losses"], abs=1e-5), changes
    # checkpointing every block keeps less (the CPU estimate)
    cfg = tiny.cfg
    assert estimate_peak_bytes(cfg, 2, "fp32", 1) < estimate_peak_bytes(cfg, 2, "fp32", 0)
    assert estimate_peak_bytes(cfg, 4, "fp32", 0) > estimate_peak_bytes(cfg, 2, "fp32", 0)
    assert estimate_peak_bytes(cfg, 2, "bf16", 0) < estimate_peak_bytes(cfg, 2, "fp32", 0)


def test_grad_accumulation_is_equivalent_to_a_larger_micro_batch() -> None:
    """micro 2 x accum 2 == micro 4 x accum 1 == micro 1 x accum 4 (grad_accum a knob: global_batch null)."""
    free = TrainStep(model="tiny", steps=2, warmup_steps=1)
    runs = [_run(free, _config(micro=m, grad_accum=a, optimizer="adamw_fused")) for m, a in ((2, 2), (4, 1), (1, 4))]
    assert all(r.status == TrialStatus.OK for r in runs), [r.error for r in runs]
    for other in runs[1:]:
        assert other.extra["losses"] == pytest.approx(runs[0].extra["losses"], abs=1e-5)
        assert other.extra["global_batch"] == 4
    assert abs(runs[0].metrics["loss_delta"]) < 1e-4


def test_work_exports_and_mfu() -> None:
    w = TrainStep(model="1b", global_batch=8)
    from models.config import model_flops_per_token

    flops, moved, precision = w.work(_config(micro=2, precision="fp8"))
    assert flops == pytest.approx(model_flops_per_token(w.cfg, training=True) * 8 * 2048)
    assert moved > 28 * w.cfg.n_params() and precision == "bf16"
    assert w.work(_config(micro=2, precision="tf32"))[2] == "tf32"
    exported = w.export_config(_config(micro=2, precision="bf16", compile="default", attention="sdpa_flash"))
    assert exported["grad_accum"] == 4 and exported["global_batch"] == 8
    json.dumps(exported)
    for config in (
        _config(micro=2, precision="fp16", attention="sdpa_cudnn"),
        _config(precision="fp8", compile="default"),
    ):
        source = w.export_python(config)
        compile(source, "<export>", "exec")
    assert "fused=True" in w.export_python(_config(optimizer="adamw_fused"))
    assert all(isinstance(v, str) for v in w.export_env(_config()).values())
    # mfu: model FLOPs per second over the precision's peak (fp8: the fp8/bf16 harmonic mix)
    tokens_per_s = 100_000.0
    expected = model_flops_per_token(w.cfg, training=True) * tokens_per_s / 989.4e12
    assert w._mfu(tokens_per_s, "bf16", H200) == pytest.approx(expected)
    mixed = fp8_mixed_peak({"fp8": 1978.9, "bf16": 989.4})
    assert 989.4 < mixed < 1978.9 and mixed == pytest.approx(1187.3, rel=1e-3)
    assert w._mfu(tokens_per_s, "bf16", CPU) == 0.0


# --------------------------------------------------------------------------- failures


def test_a_launch_that_trains_nothing_or_diverges_is_numerics_fail(tiny: TrainStep, monkeypatch) -> None:
    monkeypatch.setattr(tiny, "_launch", lambda config, case: None)
    result = _run(tiny, _config())
    assert result.status == TrialStatus.NUMERICS_FAIL and "NaN" in result.error
    monkeypatch.undo()
    original = tiny._launch

    def diverge(config: dict[str, Any], case: Any) -> None:
        original(config, case)
        case.losses[-2] = torch.tensor(float("inf"))

    monkeypatch.setattr(tiny, "_launch", diverge)
    result = _run(tiny, _config())
    assert result.status == TrialStatus.NUMERICS_FAIL and "inf" in result.error


def test_memory_limit_refuses_configs_estimated_far_over_it_on_a_gpu() -> None:
    """0.98B parameters: 15.6 GB of fp32 states; a 24 GB card leaves room for checkpointed small micro-batches."""
    w = TrainStep(model="1b", global_batch=8, memory_limit_gb=24)
    lean = _config(micro=1, precision="bf16", checkpoint=1, attention="sdpa_flash", optimizer="adamw_fused")
    assert w.static_check(lean, H200) is None
    assert estimate_peak_bytes(w.cfg, 1, "bf16", 1) / 1e9 < 24
    fat = {**lean, "micro_batch": 8, "checkpoint": 0}
    reason = w.static_check(fat, H200)
    assert reason is not None and "memory_limit_gb=24" in reason and "estimated peak" in reason
    # On a CPU the estimate is the measurement: the trial runs and reports oom (next test).
    assert w.static_check({**fat, "attention": "sdpa"}, CPU) is None
    assert TrainStep(model="1b", global_batch=8).static_check(fat, H200) is None


def test_simulated_oom_from_memory_limit() -> None:
    small = TrainStep(model="tiny", global_batch=4, steps=1, warmup_steps=1, memory_limit_gb=0.0025)
    over = _run(small, _config(micro=4))  # estimate ~3.6 MB
    assert over.status == TrialStatus.OOM and "memory_limit_gb" in over.error
    assert over.metrics["peak_mem_gb"] > 0.0025
    under = _run(small, _config(micro=1, checkpoint=1))
    assert under.status == TrialStatus.OK and under.metrics["peak_mem_gb"] <= 0.0025


class OutOfResources(Exception):
    """Named like Triton's."""


class BackendCompilerFailed(Exception):
    """Named like torch._dynamo's."""


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), TrialStatus.OOM),
        (lambda: OutOfResources("out of resource: shared memory"), TrialStatus.OUT_OF_RESOURCES),
        (lambda: BackendCompilerFailed("backend='inductor' raised: ..."), TrialStatus.COMPILE_ERROR),
    ],
    ids=["oom", "out_of_resources", "compile"],
)
def test_launch_failures_become_statuses(tiny: TrainStep, monkeypatch, exc: Any, status: TrialStatus) -> None:
    def fail(config: dict[str, Any], case: Any) -> None:
        raise exc()

    monkeypatch.setattr(tiny, "_launch", fail)
    result = _run(tiny, _config())
    assert result.status == status and result.error
    assert not result.extra.get("replace_worker")  # CPU: nothing to leak
    monkeypatch.setattr(tiny, "_launch", lambda config, case: (_ for _ in ()).throw(KeyError("other")))
    with pytest.raises(KeyError):
        _run(tiny, _config())


# --------------------------------------------------------------------------- through the engine


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("ray_session")
def test_study_through_the_engine_then_resume(sqlite_url: str) -> None:
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    spec = {
        "name": "train-step-cpu",
        "workload": "train_step",
        "args": {"model": "tiny", "global_batch": 4, "steps": 2, "warmup_steps": 1},
        "space": {
            "micro_batch": {"high": 4},
            "precision": {"choices": ["fp32", "bf16", "fp16"]},
            "attention": {"choices": ["sdpa", "math"]},
            "compile": {"choices": ["off"]},
        },
        "objectives": [{"metric": "tokens_per_s"}, {"metric": "peak_mem_gb"}, {"metric": "loss_error"}],
        "constraints": ["peak_mem_gb <= 0.01"],
        "budget": {"trials": 4, "trial_timeout_s": 120},
        "seed": 2,
        "warm_start": False,
    }
    db = StudyDB(sqlite_url)
    summary = Orchestrator(load_spec(spec), db, workers=1).run()
    first = db.trials(summary.study_id)
    measured = [t for t in first if t.status != "infeasible_static" and t.duplicate_of is None]
    assert summary.status == "completed" and len(measured) == 4
    assert all(t.status == "ok" for t in measured), [(t.status, t.error) for t in measured]
    for t in measured:
        assert t.metrics["tokens_per_s"] > 0 and 0 < t.metrics["peak_mem_gb"] < 0.01
        assert abs(t.metrics["loss_delta"]) < 0.05 and t.timing_comparable is False
    assert summary.pareto and all(t.feasible for t in summary.pareto)
    # resume with a larger budget: the first trials stay, two more are added
    resumed = Orchestrator(load_spec({**spec, "budget": {"trials": 6, "trial_timeout_s": 120}}), db, workers=1).run()
    assert resumed.study_id == summary.study_id
    trials = db.trials(resumed.study_id)
    again = [t for t in trials if t.status != "infeasible_static" and t.duplicate_of is None]
    assert len(again) == 6 and all(t.status == "ok" for t in again)
    assert [t.params for t in trials[: len(first)]] == [t.params for t in first]
    db.dispose()


# --------------------------------------------------------------------------- GPU only

gpu_only = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", reason="needs a CUDA GPU"
)
SMALL_GPU_MODEL = {"vocab_size": 8192, "n_layers": 4, "d_model": 512, "n_heads": 8, "seq_len": 512}


@pytest.mark.gpu
@gpu_only
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "changes",
    [
        {"precision": "bf16", "attention": "sdpa_flash", "optimizer": "adamw_fused"},
        {"precision": "fp16", "attention": "sdpa_efficient", "checkpoint": 2},
        {"precision": "tf32", "attention": "sdpa"},
        {"precision": "bf16", "attention": "sdpa_cudnn", "compile": "default", "optimizer": "adamw_fused"},
        {"precision": "fp8", "attention": "sdpa_flash", "optimizer": "adamw_fused"},
        {"precision": "fp8", "attention": "sdpa_flash", "compile": "default", "checkpoint": 1},
        {"precision": "bf16", "attention": "triton", "checkpoint": 2, "optimizer": "adamw_fused"},
        {"precision": "bf16", "attention": "triton", "compile": "default"},
    ],
    ids=[
        "bf16-flash",
        "fp16-efficient-ckpt",
        "tf32",
        "bf16-cudnn-compile",
        "fp8",
        "fp8-compile-ckpt",
        "bf16-triton-ckpt",
        "bf16-triton-compile",
    ],
)
def test_training_on_gpu(changes: dict[str, Any]) -> None:
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    workload = TrainStep(model=SMALL_GPU_MODEL, global_batch=8, steps=3, warmup_steps=2)
    config = _config(micro=4, **changes)
    reason = workload.static_check(config, device)
    if reason:
        pytest.skip(reason)
    before = torch.cuda.memory_allocated()
    result = workload.run(config, device, TrialContext())
    assert result.status == TrialStatus.OK, result.error
    assert result.timing_comparable and len(result.samples_ms) == 3
    assert result.metrics["tokens_per_s"] > 0 and result.metrics["peak_mem_gb"] > 0.05
    assert 0 < result.metrics["mfu"] < 1
    bound = {"tf32": 0.01, "bf16": 0.05, "fp16": 0.05, "fp8": 0.15}[config["precision"]]
    assert abs(result.metrics["loss_delta"]) < bound, result.extra["losses"]
    assert not result.extra.get("replace_worker")
    # What stays allocated is cuBLAS's workspace at most (the worker's leak tolerance).
    assert torch.cuda.memory_allocated() - before <= LEAK_TOLERANCE_BYTES


@pytest.mark.gpu
@gpu_only
@pytest.mark.timeout(600)
def test_real_oom_on_gpu_frees_everything() -> None:
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    huge = {"vocab_size": 65536, "n_layers": 2, "d_model": 1024, "n_heads": 8, "seq_len": 4096}
    workload = TrainStep(model=huge, global_batch=256, steps=1, warmup_steps=1, reference_steps=1)
    workload._references[("cuda", 256)] = [0.0]  # the fp32 reference itself would not fit
    before = torch.cuda.memory_allocated()
    result = workload.run(_config(micro=256), device, TrialContext())  # fp32 logits alone: 256 GiB
    assert result.status == TrialStatus.OOM, result.error
    assert not result.extra.get("replace_worker")
    # What stays allocated is cuBLAS's workspace at most (the worker's leak tolerance).
    assert torch.cuda.memory_allocated() - before <= LEAK_TOLERANCE_BYTES
    ok = TrainStep(model=SMALL_GPU_MODEL, global_batch=4, steps=1, warmup_steps=1)
    assert ok.run(_config(micro=4), device, TrialContext()).status == TrialStatus.OK
