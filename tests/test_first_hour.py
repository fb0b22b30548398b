"""A new user's first hour on a CPU: real studies of the kernel workloads under the Triton interpreter,
published to the registry, looked up with the README's client call from where the caller runs (``cpu``),
the function imported and called on small tensors, compared with torch; each precision's winner kept."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_config_client import serving

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("interpreter")]

#: name -> (workload, args, space overrides, precisions measured): small shapes, a few trials each.
STUDIES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "gemm": (
        "triton_gemm",
        {"m": 64, "n": 64, "k": 64},
        {
            "BLOCK_M": {"high": 32},
            "BLOCK_N": {"high": 32},
            "BLOCK_K": {"high": 32},
            "precision": {"choices": ["fp32", "fp16"]},
        },
    ),
    "rmsnorm": (
        "rmsnorm",
        {"rows": 8, "cols": 256},
        {"BLOCK": {"high": 512}, "precision": {"choices": ["fp32", "fp16"]}},
    ),
    "softmax": (
        "softmax",
        {"rows": 8, "cols": 256},
        {"BLOCK": {"high": 512}, "precision": {"choices": ["fp32", "fp16"]}},
    ),
    "axpy": ("axpy", {"n": 4096}, {"BLOCK": {"high": 1024}, "precision": {"choices": ["fp32"]}}),
    "attention": (
        "flash_attention",
        {"batch": 1, "heads": 1, "seq_len": 32, "head_dim": 64, "causal": True},
        {"BLOCK_M": {"high": 32}, "BLOCK_N": {"high": 32}, "num_stages": {"high": 2}},
    ),
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[tuple[str, dict[str, int], str]]:
    """Each of :data:`STUDIES` run on the engine (CPU, interpreter) and published; yields the registry
    server's URL, the study ids and the database's URL."""
    from api.main import create_app
    from api.settings import Settings
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    url = f"sqlite:///{Path(tmp_path_factory.mktemp('first-hour')) / 'tuner.db'}"
    db = StudyDB(url)
    ids = {}
    for name, (workload, args, space) in STUDIES.items():
        spec = {
            "name": f"first-hour-{name}",
            "workload": workload,
            "args": args,
            "space": space,
            "objectives": [{"metric": "latency_ms", "direction": "minimize"}],
            "budget": {"trials": 6, "trial_timeout_s": 300},
            "warm_start": False,
            "seed": 0,
        }
        summary = Orchestrator(load_spec(spec), db).run()
        assert summary.status == "completed", (name, summary)
        ids[name] = summary.study_id
    app = create_app(Settings(db_url=url))
    with serving(app) as base:
        yield base, ids, url
    db.dispose()


@pytest.fixture
def client(registry: tuple[str, dict[str, int], str], tmp_path: Path) -> Any:
    from tuner import client

    client.configure(registry[0], cache_path=tmp_path / "cache.json")
    yield client
    client._default = None


def test_the_readme_call_runs_the_gemm_winner_on_cpu(client: Any) -> None:
    """``fn(a, b, **best_config(...))``: the lookup names the function, no ``gpu=`` (the caller is a CPU)."""
    import torch

    from kernels.gemm.gemm import prepare_inputs

    kwargs = client.best_config("triton_gemm", m=64, n=64, k=64)
    assert kwargs.function in ("kernels.gemm.gemm.matmul", "kernels.gemm.gemm_tma.matmul_persistent")
    assert kwargs.params["precision"] == kwargs["precision"] and "kernel" in kwargs.params
    fn = client.load_function(kwargs.function)
    inputs = prepare_inputs(64, 64, 64, kwargs["precision"], "cpu", seed=1)
    c = fn(inputs.a, inputs.b, scale_a=inputs.scale_a, scale_b=inputs.scale_b, **kwargs)
    ref = inputs.a.float() @ inputs.b.float()
    assert torch.allclose(c.float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))

    call = client.best_call("triton_gemm", m=64, n=64, k=64)
    assert call == {"function": kwargs.function, "kwargs": dict(kwargs), "params": kwargs.params}


def test_the_readme_call_runs_the_row_wise_and_axpy_winners_on_cpu(client: Any) -> None:
    import torch

    from kernels.norms.rmsnorm import DTYPES

    x = torch.randn(8, 256)
    rms = client.best_config("rmsnorm", rows=8, cols=256)
    assert rms.function == "kernels.norms.rmsnorm.rmsnorm"
    xd, w = x.to(DTYPES[rms["precision"]]), torch.rand(256).to(DTYPES[rms["precision"]])
    ref = xd.float() / torch.sqrt(xd.float().pow(2).mean(-1, keepdim=True) + rms["eps"]) * w.float()
    assert torch.allclose(rms.load()(xd, w, **rms).float(), ref, rtol=1e-2, atol=1e-2)

    soft = client.best_config("softmax", rows=8, cols=256)
    assert soft.function == "kernels.norms.softmax.softmax"
    xs = x.to(DTYPES[soft["precision"]])
    assert torch.allclose(soft.load()(xs, **soft).float(), torch.softmax(xs.float(), -1), rtol=1e-2, atol=1e-3)

    axpy = client.best_config("axpy", n=4096)
    assert axpy.function == "kernels.elementwise.axpy.axpy" and set(axpy) == {"BLOCK", "num_warps"}
    a, b, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    axpy.load()(a, b, 2.0, out, **axpy)
    assert torch.allclose(out, 2.0 * a + b)


def test_the_readme_call_runs_the_attention_winner_on_cpu(client: Any) -> None:
    import torch

    from kernels.attention.attention import DTYPES

    kwargs = client.best_config("flash_attention", batch=1, heads=1, seq_len=32, head_dim=64, causal=True)
    assert kwargs.function == "kernels.attention.attention.attention" and kwargs["causal"] is True
    q, k, v = (torch.randn(1, 1, 32, 64).to(DTYPES[kwargs.params["precision"]]) for _ in range(3))
    out = kwargs.load()(q, k, v, **kwargs)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert torch.allclose(out.float(), ref, rtol=1e-2, atol=1e-2)


def test_lookups_default_to_the_callers_device_and_any_gpu_is_asked_for_by_name(client: Any) -> None:
    assert client.local_device() == "cpu"  # no CUDA here
    assert client.best_config("triton_gemm", m=64, n=64, k=64, gpu="cpu") == client.best_config(
        "triton_gemm", m=64, n=64, k=64
    )
    with pytest.raises(client.ConfigNotFound, match="on any GPU"):
        client.best_config("triton_gemm", m=64, n=64, k=64, gpu="any")


def test_every_precision_a_study_measured_has_its_winner_in_the_registry(client: Any) -> None:
    pick = client.best_call("triton_gemm", m=64, n=64, k=64)
    others = {"fp32", "fp16"} - {pick["params"]["precision"]}
    for precision in others:
        found = client.best_call("triton_gemm", m=64, n=64, k=64, precision=precision)
        assert found["params"]["precision"] == found["kwargs"]["precision"] == precision
    for name in ("rmsnorm", "softmax"):
        for precision in ("fp32", "fp16"):
            assert client.best_config(name, rows=8, cols=256, precision=precision)["precision"] == precision


def test_the_call_form_of_each_variant_is_the_functions_signature() -> None:
    """Every variant's ``launch_call`` names a function that takes exactly those keyword arguments."""
    import inspect

    from objectives.flash_attention import FlashAttention
    from objectives.quant_gemm import QuantGemm
    from objectives.triton_gemm import TritonGemm
    from tuner.client import load_function

    tile = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
    cases = [
        (TritonGemm(256, 256, 256), {**tile, "precision": "fp16", "kernel": kernel})
        for kernel in ("tutorial", "persistent_tma", "persistent_tma_ws")
    ]
    attention = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "precision": "fp16"}
    cases += [
        (FlashAttention(1, 2, 128, 64), {**attention, "kernel": kernel}) for kernel in ("tutorial", "persistent_tma")
    ]
    quant = {**tile, "SPLIT_K": 1, "bits": 4, "group_size": 64, "precision": "fp16"}
    cases.append((QuantGemm(16, 256, 256), quant))
    for workload, config in cases:
        call = workload.launch_call(config)
        parameters = inspect.signature(load_function(call["function"])).parameters
        assert set(call["kwargs"]) <= set(parameters), (call["function"], set(call["kwargs"]) - set(parameters))
        required = {n for n, p in parameters.items() if p.kind == p.KEYWORD_ONLY and p.default is p.empty}
        assert required <= set(call["kwargs"]), (call["function"], required - set(call["kwargs"]))


def test_hopper_only_variants_are_statically_infeasible_on_a_cpu() -> None:
    """TMA, warp specialization and Gluon need an sm_90 GPU: the default spaces hold them on a GPU only, so
    a CPU study picks among what the interpreter runs (the workloads still run them when asked)."""
    from tuner.strategy.candidates import FeasibleSet
    from tuner.study.space import compile_space, load_space_file
    from tuner.workloads.fingerprint import device_info

    cpu = device_info().to_dict()
    assert cpu["kind"] == "cpu"
    h200 = {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": [9, 0], "smem_per_block_bytes": 232448}
    tile = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
    gemm = compile_space(load_space_file("gemm.yaml"))
    base = {**tile, "precision": "fp16", "pad_k": False}
    assert gemm.static_violation({**base, "kernel": "tutorial"}, cpu) is None
    for kernel in ("persistent_tma", "persistent_tma_ws"):
        config = {**base, "kernel": kernel, "EPILOGUE_SUBTILE": False, "STREAM_K": False}
        assert "hopper_only" in (gemm.static_violation(config, cpu) or ""), kernel
        assert gemm.static_violation(config, h200) is None, kernel
    rows = FeasibleSet(gemm, device=cpu).sample(np.random.default_rng(0), 500, set())
    assert {FeasibleSet(gemm, device=cpu).encoder.config(r)["kernel"] for r in rows} == {"tutorial"}

    attention = compile_space(load_space_file("attention.yaml"))
    at = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "precision": "fp16"}
    assert attention.static_violation({**at, "kernel": "tutorial", "use_tma": False}, cpu) is None
    for config in ({"kernel": "tutorial", "use_tma": True}, {"kernel": "persistent_tma", "SPLIT_M": False}):
        assert "hopper_only" in (attention.static_violation({**at, **config}, cpu) or ""), config
        assert attention.static_violation({**at, **config}, h200) is None, config

    quant = compile_space(load_space_file("quant_gemm.yaml"))
    packed = {"kernel": "packed", "TMA": 1}
    assert "hopper_only" in (quant.static_violation(packed, cpu) or "")
    assert "hopper_only" in (quant.static_violation({"kernel": "ws"}, cpu) or "")
    assert quant.static_violation({**packed, "TMA": 0}, cpu) is None


def test_a_cpu_study_of_the_default_gemm_space_measures_and_picks_what_the_interpreter_runs(
    registry: tuple[str, dict[str, int], str], client: Any
) -> None:
    from tuner.store.storage import StudyDB

    pick = client.best_call("triton_gemm", m=64, n=64, k=64)
    assert pick["function"] == "kernels.gemm.gemm.matmul" and pick["params"]["kernel"] == "tutorial"
    db = StudyDB(registry[2])
    measured = [t for t in db.trials(registry[1]["gemm"]) if t.status != "infeasible_static"]
    assert measured and {t.params.get("kernel", "tutorial") for t in measured} == {"tutorial"}
    db.dispose()


def test_the_strategy_proposes_from_the_feasible_set_of_a_cpu_gemm_study() -> None:
    """40 trials of the default 256^3 GEMM space on this CPU, with the space's rules and the workload's static
    check as the engine applies them: at most one replaced proposal per measured config (none, in fact)."""
    import math

    import optuna

    from objectives.triton_gemm import TritonGemm
    from tuner.strategy import TunerSampler
    from tuner.strategy.samplers import CONSTRAINTS_ATTR
    from tuner.study.space import compile_space, load_space_file
    from tuner.workloads.fingerprint import device_info

    device = device_info()
    space, workload = compile_space(load_space_file("gemm.yaml")), TritonGemm(256, 256, 256)

    def static_reason(config: dict[str, Any]) -> str | None:  # as the orchestrator's
        return space.static_violation(config, device.to_dict()) or workload.static_check(config, device)

    sampler = TunerSampler(space, seed=0, device=device.to_dict(), static_check=static_reason, budget_trials=40)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        assert static_reason(config) is None, config
        study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [0.0])
        study.tell(trial, -abs(math.log2(config["BLOCK_M"] * config["BLOCK_N"]) - 10) - config["num_stages"] / 10)
    counts = sampler.proposal_counts()
    assert counts["repeats_replaced"] == 0 and counts["static_rejected"] <= 40, counts


def test_submit_prints_a_bad_specs_errors_as_run_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The server's 422 as ``tuner run``'s list (``field: message`` a line), not raw JSON broken at 80 columns."""
    import json

    from test_newcomer import BAD_SPEC

    from api.main import create_app
    from api.settings import Settings
    from tuner.cli import main

    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps(BAD_SPEC))
    assert main(["run", str(spec), "--db", str(tmp_path / "run.db")]) != 0
    run = capsys.readouterr().err.splitlines()
    assert run[0] == "invalid spec:" and len(run) > 5
    with serving(create_app(Settings(db_url=f"sqlite:///{tmp_path / 'served.db'}"))) as url:
        assert main(["submit", str(spec), "--url", url]) == 2
    submitted = capsys.readouterr().err.splitlines()
    assert submitted == run
    assert any(line.startswith("  args.kk: unknown arg 'kk' (did you mean 'k'?)") for line in submitted)


def test_the_shutdown_report_says_what_stopped_and_what_went_back_to_the_queue(tmp_path: Path) -> None:
    from tuner.cli.serve import shutdown_report
    from tuner.run.service import REQUEUED
    from tuner.store import lifecycle
    from tuner.store.storage import StudyDB

    db = StudyDB(f"sqlite:///{tmp_path / 'serve.db'}")
    db.create_tables()
    spec = {"name": "first", "workload": "noop", "objectives": [{"metric": "latency_ms"}], "budget": {"trials": 40}}
    first = db.create_study(name="first", workload="noop", spec=spec, space={}, space_hash="0")
    db.create_study(name="second", workload="noop", spec={**spec, "name": "second"}, space={}, space_hash="0")
    assert lifecycle.claim_next(db, "runner-1", 60).id == first.id
    for number in range(7):
        db.insert_trial(first.id, number, {"x": number}, optuna_trial_id=None)
        db.finish_trial(
            first.id, number, status="ok", metrics={"latency_ms": 1.0}, samples_ms=[1.0], feasible=True,
            timing_comparable=False, error=None, worker="w0", attempt=1, fingerprint={},
        )  # fmt: skip
    running = [row.id for row in db.list_studies() if row.status == "running"]
    assert lifecycle.hand_back(db, first.id, "runner-1", REQUEUED)  # what the runner does when it is stopped
    lines = shutdown_report(db, running, "http://127.0.0.1:8000/", True)
    assert lines[0] == "stopped: the service on http://127.0.0.1:8000/ and its study runner"
    assert f"  study first (id {first.id}) went back to the queue at 7/40 trials" in lines
    assert any(line.startswith("  queued: 2 (first, second)") for line in lines)
    db.dispose()


def test_ctrl_c_of_tuner_serve_prints_the_report(tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tuner.cli", "serve", "--no-runner", "--port", str(port), "--db"]
    serve = subprocess.Popen(
        [*command, str(tmp_path / "t.db")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        serve.send_signal(signal.SIGINT)
        _, stderr = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            serve.kill()
    assert f"stopped: the service on http://127.0.0.1:{port}/" in stderr
    assert "no study was running or queued" in stderr


def test_importances_print_no_optuna_lines(tmp_path: Path) -> None:
    """A page's parameter importances build an in-memory Optuna study: nothing of it reaches the terminal."""
    import optuna

    from api.importance import importances
    from tuner.store.storage import StudyDB
    from tuner.study.space import load_space_file

    db = StudyDB(f"sqlite:///{tmp_path / 'imp.db'}")
    db.create_tables()
    spec = {"name": "axpy", "workload": "axpy", "objectives": [{"metric": "latency_ms", "direction": "minimize"}]}
    row = db.create_study(
        name="axpy", workload="axpy", spec=spec, space=load_space_file("axpy.yaml"), space_hash="0",
        objectives=[("latency_ms", "minimize")],
    )  # fmt: skip
    for number, block in enumerate((128, 256, 512, 1024, 2048, 4096)):
        db.insert_trial(row.id, number, {"BLOCK": block, "num_warps": 4, "precision": "fp32"}, optuna_trial_id=None)
        db.finish_trial(
            row.id, number, status="ok", metrics={"latency_ms": 1.0 + number % 3}, samples_ms=[1.0], feasible=True,
            timing_comparable=False, error=None, worker="w0", attempt=1, fingerprint={},
        )  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.INFO)  # a fresh server process: nothing lowered it yet
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("optuna").addHandler(handler)
    try:
        assert importances(db, db.get_study(row.id))  # the scratch study was built
    finally:
        logging.getLogger("optuna").removeHandler(handler)
    assert not [line for line in said if "A new study created" in line], said
    db.dispose()


def test_the_demo_prints_the_database_path_absolute_and_what_it_stopped(tmp_path: Path) -> None:
    """scripts/demo.sh on a tree whose set-up, ``tuner`` and ``curl`` stand in for the real ones (recording what
    they are asked): the next commands name the database by its absolute path; Ctrl-C says what stopped."""
    import os
    import shutil
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    tree, bin_dir = tmp_path / "tree", tmp_path / "venv" / "bin"
    (tree / "scripts").mkdir(parents=True)
    bin_dir.mkdir(parents=True)
    shutil.copy(root / "scripts" / "demo.sh", tree / "scripts" / "demo.sh")
    shutil.copytree(root / "examples", tree / "examples")
    scripts = {
        tree / "scripts" / "setup.sh": "exit 0\n",
        bin_dir / "python": f'exec {sys.executable} "$@"\n',
        bin_dir / "tuner": (
            f'echo "$@" >> {tmp_path / "tuner.log"}\n'
            'if [ "$1" = serve ]; then trap \'echo "stopped: the service" >&2; exit 0\' TERM INT\n'
            "  while true; do sleep 0.1; done; fi\n"
            'echo "study $2 (id 1) queued"\n'
        ),
        bin_dir / "curl": """case "$*" in *healthz*) exit 0;; esac
echo '{"items": [{"id": 1, "name": "demo-replay-h200-gemm"}]}'\n""",
    }
    for path, body in scripts.items():
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    env = {k: v for k, v in os.environ.items() if k != "TUNER_DB_URL"}
    env.update(TUNER_VENV=str(tmp_path / "venv"), PATH=f"{bin_dir}:/usr/bin:/bin")
    # Ctrl-C as a terminal delivers it: whatever this process ignores (a test runner may ignore SIGINT), the demo
    # starts with the default action
    restore = "import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp('bash', ['bash', 'scripts/demo.sh'])"  # noqa: E501
    demo = subprocess.Popen(
        [sys.executable, "-c", restore], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    lines = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line.rstrip("\n"))
            if "tuner export" in line:
                break
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole foreground group
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    db = tree / "tuner.db"
    assert f"    tuner status --db {db}" in lines and f"    tuner trials demo-replay-h200-gemm --db {db}" in lines
    assert f"serve --db {db} --port 8000" in (tmp_path / "tuner.log").read_text()
    assert "stopped: the service" in rest and "demo stopped; run it again to resume" in rest


def test_publishing_keeps_each_precisions_winner_and_a_plain_lookup_gets_the_pick(tmp_path: Path) -> None:
    from test_configs import CPU, gemm_config, measured_study

    from tuner.best_configs import registry as configs
    from tuner.store.storage import StudyDB

    db = StudyDB(f"sqlite:///{tmp_path / 'mix.db'}")
    db.create_tables()
    trials = [(gemm_config(precision="fp16"), 2.0), (gemm_config(precision="fp32"), 1.0)]
    trials.append((gemm_config(precision="fp32", BLOCK_M=32), 1.5))
    done = configs.publish(db, measured_study(db, "mix", {"m": 64, "n": 64, "k": 64}, trials, device=CPU))
    assert done.action == "added" and [o.action for o in done.others] == ["added"]
    shape = {"m": 64, "n": 64, "k": 64}
    fp32 = configs.lookup(db, "triton_gemm", shape, gpu="cpu", fixed={"precision": "fp32"}).matches[0].entry
    assert fp32.config["precision"] == "fp32" and fp32.value == 1.5 and fp32.trial_number == 2
    assert configs.lookup(db, "triton_gemm", shape, gpu="cpu", k=2).matches[0].entry.value == 2.0  # the pick
    db.dispose()
