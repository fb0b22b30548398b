"""Every input is bounded: a hostile or malformed spec is refused at submit (4xx naming the field), the
expression evaluator and the spaces never compute or allocate without bound, the loopback check is exact,
and exports are safe to paste into a shell or a Python file."""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings, is_loopback
from tuner.results.export import render
from tuner.study import expr
from tuner.study.space import SpaceError, compile_space, load_space_file
from tuner.workloads.registry import workload_class

pytestmark = [pytest.mark.timeout(60)]  # each refusal is immediate; before the fix some took many seconds
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
BIG = "@1e999@"  # stands for the JSON literal 1e999, which Python's json reads as infinity


def spec(**changes: Any) -> dict[str, Any]:
    base = {
        "name": "bounded",
        "workload": "noop",
        "objectives": [{"metric": "score"}],
        "budget": {"trials": 4},
    }
    base.update(changes)
    return base


def body(document: dict[str, Any]) -> str:
    """JSON text, with NaN / Infinity as Python's json writes them and ``BIG`` as ``1e999``."""
    return json.dumps(document).replace(f'"{BIG}"', "1e999")


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    app = create_app(Settings(db_url=sqlite_url, token=TOKEN))
    with TestClient(app) as c:
        yield c
    app.state.db.dispose()


NAN, INF = float("nan"), float("inf")
BAD_SPECS = {
    "budget-trials-nan": (spec(budget={"trials": NAN}), "budget.trials"),
    "budget-minutes-infinity": (spec(budget={"minutes": INF}), "budget.minutes"),
    "budget-timeout-1e999": (spec(budget={"trial_timeout_s": BIG}), "budget.trial_timeout_s"),
    "args-nan": (spec(args={"sleep_ms": NAN}), "args.sleep_ms"),
    "space-low-minus-infinity": (spec(space={"x": {"low": -INF}}), "space.x.low"),
    "int-step-1e999": (spec(space={"stages": {"step": BIG}}), "space.stages.step"),
    "step-nan": (spec(space={"x": {"step": NAN}}), "space.x.step"),
    "when-huge-power": (spec(space={"depth": {"when": "3**(3*10**7) > 0"}}), "space.depth.when"),
    "when-division-by-zero": (spec(space={"depth": {"when": "1/0 > 0"}}), "space.depth.when"),
    "when-str-vs-int": (spec(space={"depth": {"when": "mode < 1"}}), "space.depth.when"),
    "when-huge-string": (spec(space={"depth": {"when": "'a' * 10**20 == 'a'"}}), "space.depth.when"),
    "when-string-format": (spec(space={"depth": {"when": "'%0999999999d' % 1 == 'a'"}}), "space.depth.when"),
    "faults-list": (spec(args={"faults": ["hang"]}), "args"),
    "faults-string": (spec(args={"faults": "hang"}), "args"),
    "replay-file-tilde-user": (
        spec(workload="replay", args={"file": "~nosuchuser/x"}, objectives=[{"metric": "x"}]),
        "args",
    ),
    "seed-negative": (spec(seed=-1), "seed"),
    "seed-too-large": (spec(seed=2**70), "seed"),
    "constraint-infinite-bound": (spec(constraints=["score >= -1e999"]), "constraints.0"),
    "grid-too-large": (spec(sampler="grid", space={"x": {"step": 0.5}, "stages": {"high": 1e12}}), "space"),
}


@pytest.mark.parametrize(("document", "field"), list(BAD_SPECS.values()), ids=list(BAD_SPECS))
def test_a_bad_spec_is_422_naming_the_field(client: TestClient, document: dict[str, Any], field: str) -> None:
    response = client.post("/api/studies", content=body(document), headers=AUTH)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    fields = [".".join(str(p) for p in error["loc"][1:]) for error in detail]
    assert field in fields, detail
    assert client.get("/api/studies").json()["total"] == 0


@pytest.mark.parametrize("high", [3e7, 1e12])
def test_a_huge_range_is_accepted_without_materialising_it(client: TestClient, high: float) -> None:
    """``stages.high: 1e12`` was a MemoryError at compile time (a list of the range); now it is counted."""
    response = client.post("/api/studies", content=body(spec(space={"stages": {"high": high}})), headers=AUTH)
    assert response.status_code == 202, response.text


def test_ranges_are_counted_tested_and_sampled_arithmetically() -> None:
    space = compile_space(load_space_file("noop.yaml"), {"stages": {"high": 10**12, "step": 3}})
    stages = space.params["stages"]
    assert stages.count() == (10**12 - 1) // 3 + 1 and stages.value_at(stages.count() - 1) == 10**12
    assert stages.contains(1 + 3 * 10**10) and not stages.contains(2 + 3 * 10**10)
    assert not stages.contains(10**12 + 1) and not stages.contains(True)
    assert space.grid_upper_bound() is None  # x is continuous
    depth = compile_space(load_space_file("noop.yaml"), {"depth": {"high": 8 * 10**11}}).params["depth"]
    assert depth.count() == 10**11 and depth.contains(8 * 10**11) and not depth.contains(8 * 10**11 + 4)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    config = space.suggest(trial)
    assert space.validate_config(config) is None and 1 <= config["stages"] <= 10**12
    with pytest.raises(SpaceError, match="more than"):
        stages.values()
    finite = compile_space(load_space_file("noop.yaml"), {"x": {"step": 0.5}, "stages": {"high": 10**9}})
    with pytest.raises(SpaceError, match="too large"):
        finite.grid()
    with pytest.raises(SpaceError, match="2\\*\\*53"):
        compile_space(load_space_file("noop.yaml"), {"stages": {"high": 1e300}})


@pytest.mark.parametrize(
    "text",
    [
        "3**(3*10**7) > 0",
        "1/0 > 0",
        "'a' * 10**20 == 'a'",
        "10**400 > 1",
        "x < 1e999",
        "(-8) ** 0.5 > 0",
        "ceil(1e308 * 10) > 0",
        "x > 1 or log2(0) > 0",
    ],
)
def test_constant_parts_that_cannot_be_evaluated_are_refused_at_parse(text: str) -> None:
    with pytest.raises(expr.ExpressionError):
        expr.parse(text)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("x ** y > 0", {"x": 3, "y": 3 * 10**7}),
        ("s * n == s", {"s": "a", "n": 10**20}),
        ("x * x * x * x * x > 0", {"x": 2**300}),
        ("mode < 1", {"mode": "fast"}),
        ("x / y > 0", {"x": 1, "y": 0}),
        ("x % y > 0", {"x": "%0999999999d", "y": 1}),
        ("-mode == 1", {"mode": "fast"}),
        ("x * 1.0 > 0", {"x": 2**1024 - 1}),
    ],
)
def test_evaluation_is_bounded_and_every_error_is_an_expression_error(text: str, names: dict[str, Any]) -> None:
    with pytest.raises(expr.ExpressionError, match="cannot be evaluated"):
        expr.parse(text).evaluate(names)


def test_a_rule_that_fails_on_a_config_makes_it_infeasible_not_a_crash() -> None:
    document = {
        "params": {"a": {"type": "int", "low": 0, "high": 10}, "b": {"type": "int", "low": 1, "high": 4}},
        "rules": [{"name": "ratio", "expr": "b / (a - 3) < 100"}],  # its probes (0, 5, 10) divide fine
    }
    space = compile_space(document)
    assert space.static_violation({"a": 5, "b": 1}, None) is None
    assert "cannot be evaluated" in (space.static_violation({"a": 3, "b": 1}, None) or "")
    with pytest.raises(SpaceError) as info:  # a rule that fails on its probes is refused when compiled
        compile_space({**document, "rules": [{"name": "r", "expr": "b / a < 100"}]})
    assert info.value.field == "space.rules[0]"


def test_a_non_json_number_anywhere_is_422_and_the_error_is_serialisable(client: TestClient) -> None:
    document = spec(objectives=[{"metric": "score", "direction": NAN}], warm_start=INF, extra_field=NAN)
    response = client.post("/api/studies", content=body(document), headers=AUTH)
    assert response.status_code == 422, response.text
    fields = {".".join(str(p) for p in error["loc"][1:]) for error in response.json()["detail"]}
    assert {"objectives.0.direction", "warm_start", "extra_field"} <= fields
    # A NaN where a number is expected but outside the spec model: a query parameter
    assert client.get("/api/studies", params={"limit": "nan"}).status_code == 422


def test_a_chunked_body_over_the_limit_is_413_and_one_under_it_is_read(client: TestClient) -> None:
    def chunks(total: int) -> Iterator[bytes]:
        text = body(spec(args={"sleep_ms": 0, "faults": {str(i): "raise" for i in range(total)}})).encode()
        for start in range(0, len(text), 64 * 1024):
            yield text[start : start + 64 * 1024]

    response = client.post("/api/studies", content=chunks(120_000), headers=AUTH)
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert response.status_code == 413, response.text
    small = client.post("/api/studies", content=chunks(10), headers=AUTH)
    assert small.status_code == 202, small.text


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:127.0.0.1", False),
        ("localhost.example.com", False),
        ("10.0.0.1", False),
    ],
)
def test_only_127_8_and_ipv6_loopback_and_localhost_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    if not loopback:
        with pytest.raises(SystemExit, match="TUNER_API_TOKEN"):
            Settings(host=host).check()
        assert Settings(host=host, token="t").reads_need_token


HOSTILE = [
    "$(touch pwned)",
    "`touch pwned-backtick`",
    "</script><script>alert(1)</script>",
    'it\'s "quoted" \\ and $HOME ${PATH}',
    "two\nlines; touch pwned-newline",
    "'; touch pwned-quote; echo '",
    "",
    "-n",
    "tab\tand space",
]


def test_an_env_export_sourced_in_bash_runs_nothing_and_round_trips(tmp_path: Path) -> None:
    params = {f"p{i}": value for i, value in enumerate(HOSTILE)} | {"pad_k": True, "split": False, "tile": 64}
    document = {"study": "s", "trial": 3, "workload": "noop", "spec": {"args": {}}, "params": params}
    (tmp_path / "export.env").write_text(render(document, "env"))
    names = [name.upper() for name in params]
    script = "set -eu; source ./export.env; for v in " + " ".join(names) + '; do printf "%s\\0" "${!v}"; done'
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script], cwd=tmp_path, capture_output=True, timeout=30, check=True
    )
    values = out.stdout.decode().split("\0")[:-1]
    assert values == [*HOSTILE, "1", "0", "64"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.env"], "sourcing the export ran a command"


def test_a_python_export_holds_hostile_values_as_literals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = {f"p{i}": value for i, value in enumerate(HOSTILE)} | {"pad_k": True}
    document = {"study": "s", "trial": 3, "workload": "noop", "spec": {"args": {}}, "params": params}
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(render(document, "python"), "export.py", "exec"), namespace)
    assert namespace["config"] == params and list(tmp_path.iterdir()) == []


INJECTION = "bf16\nPWNED = __import__('os').system('touch pwned')\n#"
WORKLOAD_ARGS = {
    "triton_gemm": {"m": 64, "n": 64, "k": 64},
    "flash_attention": {"batch": 1, "heads": 1, "seq_len": 64, "head_dim": 64},
    "quant_gemm": {"m": 16, "n": 128, "k": 128},
    "rmsnorm": {"rows": 4, "cols": 64},
    "softmax": {"rows": 4, "cols": 64},
    "decode_step": {},
    "train_step": {},
    "collective": {},
    "ddp_step": {},
}


@pytest.mark.parametrize("name", list(WORKLOAD_ARGS))
def test_a_workload_python_export_keeps_a_hostile_string_inside_literals_and_comments(name: str) -> None:
    workload = workload_class(name)(**WORKLOAD_ARGS[name])
    config = dict(compile_space(workload.space_document()).seeds[0])
    # every string knob hostile, except those an export looks up in a table (the decode step's kv_dtype, the
    # kernels' variant: an unknown value is an error there, not code)
    hostile = {k: INJECTION if isinstance(v, str) and k not in ("kv_dtype", "kernel") else v for k, v in config.items()}
    tree = ast.parse(workload.export_python(hostile))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"PWNED", "__import__"}
