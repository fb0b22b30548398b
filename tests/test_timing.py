"""One definition of a trial's time: the kernel workloads' ``timing`` arg, the metrics beside ``latency_ms``, and what
the exports say of how a figure was timed."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.results.export import render, timing_facts, timing_line
from tuner.study.spec import SpecError, load_spec
from tuner.workloads.base import DeviceInfo, TrialContext
from tuner.workloads.registry import workload_class

CPU = DeviceInfo()
GPU = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0))
KERNEL_WORKLOADS = {
    "triton_gemm": {"m": 64, "n": 64, "k": 64},
    "flash_attention": {"batch": 1, "heads": 1, "seq_len": 64, "head_dim": 64},
    "quant_gemm": {"m": 16, "n": 128, "k": 128},
    "rmsnorm": {"rows": 4, "cols": 64},
    "softmax": {"rows": 4, "cols": 64},
    "axpy": {"n": 1024},
}


@pytest.mark.parametrize("name", sorted(KERNEL_WORKLOADS))
def test_every_kernel_workload_times_one_eager_call_unless_told_otherwise(name: str) -> None:
    args = KERNEL_WORKLOADS[name]
    eager, graph = workload_class(name)(**args), workload_class(name)(**args, timing="cuda_graph")
    assert eager.timing == "eager" and graph.timing == "cuda_graph"
    names = [m.name for m in eager.metric_specs()]
    assert {"latency_ms", "gpu_us", "host_us"} <= set(names)
    latency = next(m for m in eager.metric_specs() if m.name == "latency_ms")
    assert "max(GPU time, host launch time)" in latency.description and "cuda_graph" in latency.description
    # The stopwatch's options on a GPU: a graph only when the spec asks for one; never on a CPU.
    assert eager._timing({}, None, comparable=True)["cuda_graph"] is False
    assert graph._timing({}, None, comparable=True)["cuda_graph"] is True
    assert graph._timing({}, None, comparable=False)["cuda_graph"] is False


def test_a_spec_with_an_unknown_timing_is_refused_naming_the_field_and_the_modes() -> None:
    spec = {"name": "t", "workload": "quant_gemm", "args": {"m": 1, "n": 128, "k": 128, "timing": "graph"},
            "objectives": [{"metric": "latency_ms"}]}  # fmt: skip
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert caught.value.errors == [("args", "timing must be one of eager, cuda_graph, got 'graph'")]
    spec["args"]["timing"] = "cuda_graph"
    assert load_spec(spec).spec.args["timing"] == "cuda_graph"


def test_the_timing_keys_a_registry_entry() -> None:
    """A winner timed inside CUDA graphs is not the eager winner: the two are different registry entries."""
    cls = workload_class("quant_gemm")
    _, eager = cls.registry_key({"m": 1, "n": 128, "k": 128}, {"precision": "fp16"})
    _, graph = cls.registry_key({"m": 1, "n": 128, "k": 128, "timing": "cuda_graph"}, {"precision": "fp16"})
    assert eager["timing"] == "eager" and graph["timing"] == "cuda_graph"


def test_a_cpu_trial_reports_the_call_its_gpu_and_host_time_and_the_export_says_how() -> None:
    workload = workload_class("axpy")(n=4096)
    config = {"BLOCK": 1024, "num_warps": 4, "precision": "fp32"}
    result = workload.run(config, CPU, TrialContext())
    assert result.ok, result.error
    metrics, timing = result.metrics, result.extra["timing"]
    assert timing["mode"] == "cpu" and timing["l2"] == "warm"
    assert metrics["host_us"] == pytest.approx(metrics["latency_ms"] * 1e3)
    assert math.isfinite(metrics["gpu_us"])

    trial = SimpleNamespace(metrics=metrics, extra=result.extra)
    facts = timing_facts(trial)
    assert facts["mode"] == "cpu" and facts["l2"] == "warm" and facts["reps"] == timing["reps"]
    assert facts["latency_us"] == pytest.approx(metrics["latency_ms"] * 1e3)
    assert facts["median_ci95_us"] == pytest.approx([v * 1e3 for v in timing["ci95_ms"]])
    assert "not comparable" in facts["means"]

    document = _document(workload, config, facts)
    source = render(document, "python")
    assert f"# timed cpu: {facts['latency_us']:.1f} us a call" in source
    compile(source, "export.py", "exec")  # still valid Python
    assert "# timed cpu:" in render(document, "yaml") and "# timed cpu:" in render(document, "env")


def test_a_graph_timed_winner_whose_eager_launch_costs_more_says_it_holds_only_in_a_graph() -> None:
    trial = SimpleNamespace(
        metrics={"latency_ms": 0.0166, "gpu_us": 16.6, "host_us": 0.9},
        extra={"timing": {"mode": "cuda_graph", "ci95_ms": [0.0164, 0.0168], "reps": 40, "eager_host_ms": 0.075}},
    )
    facts = timing_facts(trial)
    assert facts["mode"] == "cuda_graph" and facts["eager_host_us"] == pytest.approx(75.0)
    line = timing_line(facts)
    assert line.startswith("timed cuda_graph: 16.6 us a call (95% CI of the median 16.4-16.8 us)")
    assert "holds only inside a CUDA graph" in line
    fast_timing = {**trial.extra["timing"], "eager_host_ms": 0.006}
    fast_launcher = SimpleNamespace(metrics=trial.metrics, extra={"timing": fast_timing})
    assert "holds only" not in timing_line(timing_facts(fast_launcher))


def test_a_trial_timed_before_host_time_was_counted_says_so() -> None:
    trial = SimpleNamespace(metrics={"latency_ms": 0.5}, extra={"timing": {"mode": "cuda_events", "reps": 10}})
    facts = timing_facts(trial)
    assert facts["l2"] == "flushed" and "host time was not counted" in facts["note"]
    assert "host time was not counted" in timing_line(facts)


def _document(workload: Any, config: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    return {"study": "s", "trial": 0, "workload": workload.name, "spec": {"args": {"n": 4096}},
            "params": config, "timing": facts, "timing_comparable": False}  # fmt: skip


def test_the_api_says_how_a_studys_trials_are_timed() -> None:
    """The study page shows the study's timing mode from the API (a kernel workload's ``timing`` arg)."""
    from api.views import study_timing

    def row(workload: str, args: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(workload=workload, spec={"args": args})

    assert study_timing(row("triton_gemm", {"m": 64}))["mode"] == "eager"
    graph = study_timing(row("quant_gemm", {"m": 1, "timing": "cuda_graph"}))
    assert graph["mode"] == "cuda_graph" and "true only for a caller that replays CUDA graphs" in graph["means"]
    assert study_timing(row("train_step", {})) is None  # a step timed its own way
    assert study_timing(row("no_such_workload", {})) is None
