"""The multi-machine deployment, on one machine: each part its own process, as docker-compose.yml runs them.

A Ray cluster started with ``ray start --head`` (token authentication, as Ray 2.59+ does by
default), the API alone (``tuner serve --no-runner``) and a runner that joins the cluster
(``tuner worker --ray-address``), sharing one study database (SQLite, and PostgreSQL where the
test server is configured). A study submitted over HTTP is run by the runner's trials on the
cluster's workers.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

SPEC = {
    "name": "deployed",
    "workload": "noop",
    "args": {"sleep_ms": 20},
    "space": {"tile": {"high": 128}, "stages": {"high": 4}},
    "objectives": [{"metric": "score"}, {"metric": "cost"}],
    "budget": {"trials": 6},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM to the process alone, then its whole session if it does not end in ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head on a free port: its address, and the environment that joins it (the auth token)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)})
    ray_cli = Path(sys.executable).with_name("ray")
    log = tmp_path / "ray-head.log"
    command = [str(ray_cli), "start", "--head", f"--port={port}", "--num-cpus=2"]
    command += ["--include-dashboard=false", "--disable-usage-stats", "--block"]
    with log.open("w") as out:
        head = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "block forever" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", env
    finally:
        # The head's session holds the control store, the raylet and the cluster's workers.
        try:
            os.killpg(head.pid, signal.SIGTERM)
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        except ProcessLookupError:
            pass


def test_api_and_a_runner_on_a_ray_cluster_run_a_submitted_study(
    db_url: str, ray_cluster: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    import httpx

    from tuner.store.storage import StudyDB

    address, ray_env = ray_cluster
    StudyDB(db_url).create_tables()
    api_port = free_port()
    python = [sys.executable, "-m", "tuner.cli"]
    api = subprocess.Popen(
        [*python, "serve", "--no-runner", "--db", db_url, "--port", str(api_port)],
        env={**os.environ, "TUNER_API_TOKEN": "deploy-token"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    runner_log = tmp_path / "runner.log"
    with runner_log.open("w") as out:
        runner = subprocess.Popen(
            [*python, "worker", "--db", db_url, "--ray-address", address, "--workers", "1"],
            env=ray_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{api_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert api.poll() is None and time.monotonic() < deadline, "the API did not start"
            time.sleep(0.3)
        answer = httpx.post(
            f"{url}/api/studies", json=SPEC, headers={"Authorization": "Bearer deploy-token"}, timeout=30
        )
        assert answer.status_code == 202, answer.text
        study_url = f"{url}{answer.json()['url']}"
        deadline = time.monotonic() + 180
        while (study := httpx.get(study_url, timeout=10).json())["status"] != "completed":
            assert study["status"] in ("queued", "running"), study
            assert runner.poll() is None and time.monotonic() < deadline, runner_log.read_text()[-4000:]
            time.sleep(0.5)
    finally:
        stop(runner)
        stop(api)
    db = StudyDB(db_url)
    trials = db.trials(db.find_study("deployed").id)
    assert len(trials) == 6 and all(t.status == "ok" for t in trials)
    log = runner_log.read_text()
    assert "took study" in log and "Started a local Ray instance" not in log, log[-4000:]
    db.dispose()


def test_a_local_run_starts_its_own_ray_beside_a_running_cluster(
    ray_cluster: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """Without an address, ``ray.init`` would join the machine's ``ray start`` cluster (and refuse the
    CPU count asked for a local one): ``tuner run`` starts its own local Ray instead."""
    import yaml

    from tuner.store.storage import StudyDB

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(dict(SPEC, name="local-beside-cluster", budget={"trials": 3})))
    db_path = tmp_path / "local.db"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "run", str(spec), "--db", str(db_path), "--workers", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    db = StudyDB(str(db_path))
    assert db.find_study("local-beside-cluster").status == "completed"
    db.dispose()


REPO = Path(__file__).resolve().parent.parent


def test_the_compose_file_runs_commands_that_exist_on_the_image_it_builds() -> None:
    """What docker-compose.yml runs (not run here: no Docker daemon) against the CLI it calls, and the
    Dockerfile against the packages the project ships."""
    import yaml

    from tuner.cli import build_parser

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "api", "ray-head", "ray-gpu-worker", "runner"}
    ray_help = subprocess.run(
        [str(Path(sys.executable).with_name("ray")), "start", "--help"], capture_output=True, text=True, check=True
    ).stdout
    commands = {}
    for name, service in services.items():
        if name == "postgres":
            continue
        env = service["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" in env, name
        assert env["TUNER_DB_URL"].startswith("postgresql+psycopg://tuner:"), name
        command = service["command"]
        steps = [shlex.split(step) for step in command[2].split("&&")] if command[:2] == ["sh", "-c"] else [command]
        commands[name] = steps
        for step in steps:
            step = step[1:] if step[0] == "exec" else step
            if step[0] == "tuner":
                build_parser().parse_args(step[1:])  # exits on an unknown flag
            else:
                assert step[:2] == ["ray", "start"], (name, step)
                for flag in step[2:]:
                    assert flag.split("=")[0] in ray_help, (name, flag)
    assert "TUNER_API_TOKEN" in services["api"]["environment"]  # it binds beyond loopback
    assert "--no-runner" in services["api"]["command"]
    # The runner's host joins the cluster (a driver needs a local Ray node), then drives it.
    join, runner = commands["runner"]
    assert join[:3] == ["ray", "start", "--address=ray-head:6379"] and "--num-gpus=0" in join
    assert runner[runner.index("--ray-address") + 1] == "ray-head:6379"
    assert services["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # The image holds every package the project installs.
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    dockerfile = (REPO / "Dockerfile").read_text()
    for pattern in packages["include"]:
        assert f"COPY {pattern.rstrip('*')} " in dockerfile, pattern
