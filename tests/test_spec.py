"""Every bad spec is refused before anything runs, with a message naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tuner.study.spec import SpecError, load_spec

pytestmark = pytest.mark.timeout(60)

GOOD: dict[str, Any] = {
    "name": "gemm-bf16-4096",
    "workload": "triton_gemm",
    "args": {"m": 4096, "n": 4096, "k": 4096},
    "space": {"precision": {"choices": ["bf16", "fp16"]}},
    "objectives": [
        {"metric": "tflops", "direction": "maximize"},
        {"metric": "max_rel_error", "direction": "minimize"},
    ],
    "constraints": ["max_rel_error <= 0.05"],
    "budget": {"trials": 40, "minutes": 30},
    "sampler": "auto",
    "seed": 0,
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = spec
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return spec


def refused(spec: dict[str, Any] | str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    return info.value


def test_issue_example_is_accepted() -> None:
    compiled = load_spec(GOOD)
    assert compiled.objectives == [("tflops", "maximize"), ("max_rel_error", "minimize")]
    assert compiled.space.params["precision"].choices == ("bf16", "fp16")
    assert compiled.constraints[0].left == "max_rel_error"


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        ("workload", "triton_gemmm", "workload", "unknown workload"),
        ("objectives.0.metric", "tflopz", "objectives.0.metric", "unknown metric"),
        ("space.BLOCK_M", {"type": "int", "low": 256, "high": 16}, "space.BLOCK_M.low", "low (256) > high (16)"),
        ("space.BLOCK_M", {"type": "int", "low": 0, "high": 256, "log": True}, "space.BLOCK_M.low", "log scale"),
        ("space.precision", {"choices": []}, "space.precision.choices", "non-empty"),
        ("space.GROUP_M", {"choices": [4, 4]}, "space.GROUP_M.choices", "duplicate"),
        ("space.BLOCK_Q", {"choices": [1]}, "space.BLOCK_Q", "unknown param"),
        ("space.BLOCK_M", {"type": "pow2", "low": 24, "high": 256}, "space.BLOCK_M.low", "power of two"),
        ("space.BLOCK_M", {"type": "wide"}, "space.BLOCK_M.type", "must be one of"),
        ("objectives.1.metric", "tflops", "objectives.1.metric", "duplicate objective"),
        ("constraints.0", "max_rel_error", "constraints.0", "comparison"),
        ("constraints.0", "foo <= 1", "constraints.0", "unknown metric 'foo'"),
        ("constraints.0", "__import__('os').system('true') <= 1", "constraints.0", "calls are not allowed"),
        ("constraints.0", "max_rel_error.real <= 1", "constraints.0", "attribute"),
        ("constraints.0", "max_rel_error <= 0.05 <= 1", "constraints.0", "single comparison"),
        ("constraints.0", "(lambda: 1)() <= 1", "constraints.0", "calls are not allowed"),
        ("budget.trials", 0, "budget.trials", "greater than or equal to 1"),
        ("budget.minutes", -1, "budget.minutes", "greater than 0"),
        ("sampler", "bayes", "sampler", "Input should be"),
        ("name", "bad name/with slash", "name", "pattern"),
        ("args.m", -5, "args", "m"),
        ("args.q", 5, "args.q", "unknown arg 'q'"),  # named per arg, with the args the workload takes
        ("extra_field", 1, "extra_field", "Extra inputs"),
    ],
)
def test_bad_spec_is_refused_naming_the_field(path: str, value: Any, field: str, words: str) -> None:
    error = refused(with_change(path, value))
    fields = [f for f, _ in error.errors]
    assert field in fields, error.errors
    message = next(m for f, m in error.errors if f == field)
    assert words in message, message


def test_grid_too_large_is_refused() -> None:
    spec = with_change("sampler", "grid")
    # the default GEMM space with the tutorial kernel alone: 48000 points fits ...
    spec["space"] = {
        "kernel": {"choices": ["tutorial"]},
        "EPILOGUE_SUBTILE": {"choices": [False]},
        "FP8_FAST_ACCUM": {"choices": [True]},
    }
    load_spec(spec)
    spec["space"]["num_stages"] = {"type": "int", "low": 1, "high": 100}  # ... 1.2 million does not
    error = refused(spec)
    assert error.errors[0][0] == "space"
    assert "grid too large to enumerate" in error.errors[0][1]


def test_grid_needs_a_finite_space() -> None:
    spec = {
        "name": "noop-grid",
        "workload": "noop",
        "objectives": [{"metric": "score"}],
        "sampler": "grid",
    }
    error = refused(spec)
    assert error.errors[0][0] == "space.x"
    spec["space"] = {"x": {"step": 0.25}}
    assert len(load_spec(spec).space.grid()) > 0


def test_duplicate_keys_in_yaml_and_json_are_refused() -> None:
    yaml_text = "name: a\nworkload: noop\nobjectives: [{metric: score}]\nname: b\n"
    assert "duplicate key 'name'" in str(refused(yaml_text))
    json_text = '{"name": "a", "workload": "noop", "objectives": [{"metric": "score"}], "workload": "noop"}'
    assert "duplicate key 'workload'" in str(refused(json_text))


def test_not_a_mapping_is_refused() -> None:
    assert "mapping" in str(refused("- just\n- a list\n"))


def test_default_direction_comes_from_the_workload() -> None:
    compiled = load_spec({"name": "n", "workload": "noop", "objectives": [{"metric": "cost"}]})
    assert compiled.objectives == [("cost", "minimize")]
