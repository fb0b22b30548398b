"""Reliability and security, round 3: the env export sets only harmless names and writes no raw control
character; YAML aliases are bounded; a malformed Authorization header is a 401; a study whose stored spec
no longer builds is shown with its error, never a 500; the service's smaller exposures are closed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from tuner.results.export import ExportError, render
from tuner.store.storage import StudyDB

pytestmark = [pytest.mark.timeout(120)]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    """The API on a fresh SQLite database, answering a server error as a 500 (as a real client sees it)."""
    app = create_app(Settings(db_url=sqlite_url, token=TOKEN))
    with TestClient(app, raise_server_exceptions=False) as api:
        yield api
    app.state.db.dispose()


def noop_study(db: StudyDB, name: str, params: dict[str, Any], spec: dict[str, Any] | None = None) -> int:
    """A completed ``noop`` study of one successful trial with these params, written as a runner would."""
    spec = spec or {"name": name, "workload": "noop", "args": {}, "objectives": [{"metric": "score"}]}
    row = db.create_study(name=name, workload="noop", status="completed", space={}, space_hash="0", spec=spec)
    db.insert_trial(row.id, 0, params, optuna_trial_id=None)
    db.finish_trial(
        row.id, 0, status="ok", metrics={"score": 0.5, "cost": 1.0}, samples_ms=[1.0], feasible=True,
        timing_comparable=False, error=None, worker="w0.0", attempt=1, fingerprint={},
    )  # fmt: skip
    return row.id


def env_document(params: dict[str, Any]) -> dict[str, Any]:
    return {"study": "s", "trial": 0, "workload": "noop", "spec": {"args": {}}, "params": params}


# ------------------------------------------------------------------------------------------------ (a) env export

REFUSED_NAMES = [
    "path", "PATH", "ld_preload", "LD_LIBRARY_PATH", "pythonpath", "PYTHONSTARTUP", "home", "shell", "ifs", "env",
    "bash_env", "ps1", "PS4", "prompt_command", "dyld_insert_libraries", "cdpath", "tuner_api_token",
    "_private", "1st", "tile-size", "tile size",
]  # fmt: skip


@pytest.mark.parametrize("param", REFUSED_NAMES)
def test_the_env_export_refuses_a_name_the_shell_or_a_loader_reads(param: str) -> None:
    with pytest.raises(ExportError, match=f"param {param!r}"):
        render(env_document({"tile": 64, param: "/evil"}), "env")


def test_the_env_export_keeps_tuning_names() -> None:
    text = render(env_document({"nccl_algo": "ring", "block_m": 64, "CUDA_DEVICE_MAX_CONNECTIONS": 1}), "env")
    assert "NCCL_ALGO=ring\n" in text and "BLOCK_M=64\n" in text and "CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text


CONTROL = ["esc\x1b[31mred", "bell\x07", "cr\rhidden", "del\x7f", "c1\x85next", "vt\x0bff\x0c", "back\\slash'quote"]


def test_control_characters_are_escaped_and_round_trip_through_bash(tmp_path: Path) -> None:
    params = {f"p{i}": value for i, value in enumerate(CONTROL)} | {"nl": "two\nlines", "tab": "a\tb"}
    text = render(env_document(params), "env")
    raw = text.encode()
    bad = [b for b in raw if (b < 0x20 and b not in b"\n\t") or b == 0x7F]
    assert not bad, f"raw control bytes in the export: {bad}"
    assert "\x85" not in text
    (tmp_path / "export.env").write_bytes(raw)
    names = [name.upper() for name in params]
    script = "set -eu; source ./export.env; for v in " + " ".join(names) + '; do printf "%s\\0" "${!v}"; done'
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script], cwd=tmp_path, capture_output=True, timeout=30, check=True
    )
    assert out.stdout.decode().split("\0")[:-1] == list(params.values())


def test_a_nul_in_a_value_is_refused_naming_the_param() -> None:
    with pytest.raises(ExportError, match=r"param 'mode'.*NUL"):
        render(env_document({"mode": "a\0b"}), "env")


def test_the_api_refuses_an_env_export_of_a_denied_name_with_422(client: TestClient) -> None:
    study = noop_study(client.app.state.db, "evil-env", {"PATH": "/evil", "LD_PRELOAD": "/tmp/x.so"})
    response = client.get(f"/api/studies/{study}/export", params={"format": "env"})
    assert response.status_code == 422, response.text
    assert "PATH" in response.json()["detail"]
    assert client.get(f"/api/studies/{study}/export", params={"format": "json"}).status_code == 200


# ------------------------------------------------------------------------------------------------ (b) YAML aliases


def alias_bomb(ways: int = 9, levels: int = 9) -> str:
    """A spec whose ``space`` is ``ways ** levels`` strings once its aliases are expanded (a few hundred bytes)."""
    lines = ["name: bomb", "workload: noop", "objectives: [{metric: score}]", 'l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * ways)}]")
    lines.append(f"space: {{tile: {{choices: *l{levels}}}}}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_while_loading() -> None:
    from tuner.study.spec import SpecError, parse_spec_text
    from tuner.study.yamlio import load_yaml_text

    with pytest.raises(ValueError, match=r"bomb\.yaml: .*alias"):
        load_yaml_text(alias_bomb(), "bomb.yaml")
    with pytest.raises(SpecError, match="alias"):
        parse_spec_text(alias_bomb(), "bomb.yaml")
    recursive = "a: &a [1, *a]\n"
    with pytest.raises(ValueError, match="recursive"):
        load_yaml_text(recursive, "loop.yaml")


def test_aliases_that_stay_small_still_load() -> None:
    from tuner.study.yamlio import load_yaml_text

    assert load_yaml_text(alias_bomb(ways=3, levels=3)).get("space") == {"tile": {"choices": [[[["lol"]] * 3] * 3] * 3}}
    assert load_yaml_text("base: &b {x: 1}\nother: *b\n") == {"base": {"x": 1}, "other": {"x": 1}}


@pytest.mark.parametrize("command", ["submit", "run"])
def test_tuner_submit_and_run_refuse_an_alias_bomb_with_a_clear_error(command: str, tmp_path: Path) -> None:
    import sys

    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    where = ["--url", "http://127.0.0.1:9"] if command == "submit" else ["--db", f"sqlite:///{tmp_path / 'db'}"]
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", command, str(tmp_path / "bomb.yaml"), *where],
        capture_output=True, text=True, timeout=90, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "alias" in out.stderr and "Traceback" not in out.stderr


# ------------------------------------------------------------------------------------------------ (c) Authorization

MALFORMED_AUTH = [
    b"Bearer s3cret-token\xe9",  # the token, then a byte beyond ASCII
    b"Bearer \xff\xfe\xfd",
    "Bearer s3cret-tokén".encode(),
    b"s3cret-token",  # no scheme
    b"",
    b"Bearer",
    b"Bearer ",
    b"Basic czNjcmV0LXRva2Vu",
    b"\xe9",
]


@pytest.fixture
def guarded(sqlite_url: str) -> Iterator[int]:
    """The API bound beyond loopback (reads need the token too) served by uvicorn in a thread, which hands
    the app a header's bytes as they came (a test client re-encodes them); yields its port."""
    import threading

    import uvicorn

    app = create_app(Settings(db_url=sqlite_url, token=TOKEN, host="0.0.0.0"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        thread.join(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        app.state.db.dispose()


def raw_status(port: int, method: str, path: str, authorization: bytes) -> int:
    """The status of one HTTP/1.1 request sent as these bytes."""
    import socket

    from tests.test_reliability import _http_answer

    body = b"{}" if method == "POST" else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    request = head.encode() + b"Content-Type: application/json\r\nAuthorization: " + authorization + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = _http_answer(sock)
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("header", MALFORMED_AUTH, ids=repr)
def test_a_malformed_authorization_header_is_a_401(guarded: int, header: bytes) -> None:
    for method, path in [("GET", "/api/studies"), ("POST", "/api/studies"), ("DELETE", "/api/studies/1")]:
        assert raw_status(guarded, method, path, header) == 401, (method, path)
    assert raw_status(guarded, "GET", "/api/studies/1/export", header) == 401
    assert raw_status(guarded, "GET", "/studies/1", header) in (200, 404)  # the page; its script asks again
    assert raw_status(guarded, "GET", "/api/studies", f"Bearer {TOKEN}".encode()) == 200


def test_a_non_ascii_token_set_on_the_server_matches_its_utf8_bytes(sqlite_url: str) -> None:
    app = create_app(Settings(db_url=sqlite_url, token="s3cret-tokén", host="0.0.0.0"))
    with TestClient(app, raise_server_exceptions=False) as api:
        assert api.get("/api/studies", headers={"Authorization": "Bearer s3cret-tokén".encode()}).status_code == 200
        assert api.get("/api/studies", headers={"Authorization": "Bearer s3cret-token"}).status_code == 401
    app.state.db.dispose()


# ------------------------------------------------------------------------------------------------ (d) bad stored study

GOOD_SPEC = '{"name": "%s", "workload": "noop", "args": {}, "objectives": [{"metric": "score"}]}'
BAD_STORED = {
    "nan-arg": ('{"name": "nan-arg", "workload": "noop", "args": {"sleep_ms": NaN}, "objectives": []}', "sleep_ms"),
    "landscape-gone": (
        '{"name": "landscape-gone", "workload": "replay", "args": {"file": "moved-away.jsonl"}, "objectives": []}',
        "moved-away.jsonl",
    ),
    "not-json": ("{'name': 'not-json', oops", "not JSON"),
    "not-an-object": ('["a", "list"]', "not an object"),
}


def corrupted(db: StudyDB) -> dict[str, int]:
    """A good study and one of each kind in ``BAD_STORED``: made good, then their spec overwritten in SQL."""
    from sqlalchemy import text

    ids = {name: noop_study(db, name, {"tile": 64}) for name in ["good", *BAD_STORED]}
    with db.engine.begin() as conn:
        for name, (spec, _) in BAD_STORED.items():
            conn.execute(text("UPDATE tuner_studies SET spec = :spec WHERE id = :id"), {"spec": spec, "id": ids[name]})
        conn.execute(text("UPDATE tuner_studies SET workload = 'replay' WHERE id = :id"), {"id": ids["landscape-gone"]})
    return ids


def test_a_study_whose_stored_spec_no_longer_builds_is_listed_and_shown_with_its_error(client: TestClient) -> None:
    ids = corrupted(client.app.state.db)
    listing = client.get("/api/studies")
    assert listing.status_code == 200, listing.text
    errors = {s["name"]: s["error"] for s in listing.json()["items"]}
    assert errors.keys() == ids.keys() and errors["good"] is None
    for name, (_, reason) in BAD_STORED.items():
        assert reason in (errors[name] or ""), (name, errors[name])
        study = client.get(f"/api/studies/{ids[name]}")
        assert study.status_code == 200, (name, study.text)
        assert reason in study.json()["error"]
        for path in ("trials", "pareto", "overview"):
            assert client.get(f"/api/studies/{ids[name]}/{path}").status_code == 200, (name, path)
        page = client.get(f"/studies/{ids[name]}")
        assert page.status_code == 200 and reason in page.text, name
        for fmt in ("json", "yaml", "env", "python"):
            exported = client.get(f"/api/studies/{ids[name]}/export", params={"format": fmt})
            assert exported.status_code in (409, 422), (name, fmt, exported.status_code)
            assert reason in exported.json()["detail"], (name, fmt)
    assert client.get(f"/api/studies/{ids['good']}/export").status_code == 200


@pytest.mark.parametrize("name", list(BAD_STORED))
def test_tuner_export_of_a_bad_stored_study_says_why_in_one_line(
    name: str, sqlite_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    db = StudyDB(sqlite_url)
    db.create_tables()
    corrupted(db)
    db.dispose()
    assert main(["export", name, "--db", sqlite_url]) == 2
    said = capfd.readouterr().err
    assert BAD_STORED[name][1] in said and "Traceback" not in said
    assert len(said.strip().splitlines()) <= 3, said  # one line, as the terminal wraps it


# ------------------------------------------------------------------------------------------------ (e) smaller ones


def _listening(pids: set[int]) -> list[str]:
    """The addresses (``ip:port``) that these processes listen on, from /proc (TCP over IPv4 and IPv6)."""
    import ipaddress

    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hexip, hexport = fields[1].split(":")
            raw = bytes.fromhex(hexip)
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))  # each 32-bit word little-endian
            ip = ipaddress.ip_address(words)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            found.append(f"{ip}:{int(hexport, 16)}")
    return found


def _session(sid: int) -> set[int]:
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the command: state, ppid, pgrp, session
            pids.add(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc")
def test_a_local_ray_listens_on_loopback_only_and_its_workers_have_no_api_token() -> None:
    import ipaddress
    import sys

    from tuner.run.supervisor import kill_session

    script = (
        "import ray\nfrom tuner.run.worker_pool import ensure_ray\nensure_ray(None)\n"
        "import os\nseen = ray.get(ray.remote(lambda: os.environ.get('TUNER_API_TOKEN', 'none')).remote())\n"
        "print(seen, os.environ['TUNER_API_TOKEN'], flush=True)\ninput()\nray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env["TUNER_API_TOKEN"] = TOKEN
    ray = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, start_new_session=True, env=env,
    )  # fmt: skip
    try:
        assert ray.stdout is not None
        seen_by_a_worker, kept_by_the_driver = ray.stdout.readline().split()
        addresses = _listening(_session(ray.pid))
    finally:
        ray.communicate("\n", timeout=60)
        kill_session(ray.pid)
    assert seen_by_a_worker == "none" and kept_by_the_driver == TOKEN  # no trial worker has the API token
    assert len(addresses) >= 3, addresses  # GCS, raylet, the worker at least
    exposed = [a for a in addresses if not ipaddress.ip_address(a.rsplit(":", 1)[0].strip("[]")).is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed} (all: {addresses})"


def test_the_supervised_runner_has_no_api_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import time

    from tuner.run.supervisor import RunnerSupervisor

    monkeypatch.setenv("TUNER_API_TOKEN", TOKEN)
    out = tmp_path / "env"
    code = f"import os, time; open({str(out)!r}, 'w').write(os.environ.get('TUNER_API_TOKEN', 'none')); time.sleep(60)"
    runner = RunnerSupervisor([sys.executable, "-c", code], stop_timeout_s=5)
    runner.start()
    try:
        while not out.exists() or not out.read_text():
            time.sleep(0.05)
    finally:
        runner.stop()
    assert out.read_text() == "none"


def test_healthz_strict_is_503_while_degraded_and_plain_healthz_stays_200(client: TestClient) -> None:
    from tuner.run.supervisor import RunnerSupervisor

    assert client.get("/healthz", params={"strict": 1}).status_code == 200  # no runner: nothing is down
    client.app.state.runner = RunnerSupervisor(["true"])  # a supervised runner not started: "stopped"
    plain, strict = client.get("/healthz"), client.get("/healthz", params={"strict": 1})
    assert plain.status_code == 200 and strict.status_code == 503
    assert plain.json() == strict.json() == {"status": "degraded", "db": "ok", "runner": "stopped"}


def test_every_response_carries_the_security_headers(client: TestClient) -> None:
    from api.dashboard import CONTENT_SECURITY_POLICY

    study = noop_study(client.app.state.db, "headers", {"tile": 64})
    answers = {
        "health": client.get("/healthz"),
        "list": client.get("/api/studies"),
        "missing": client.get("/api/studies/999"),
        "invalid": client.get("/api/studies", params={"limit": 0}),
        "unauthorized": client.delete(f"/api/studies/{study}"),
        "too large": client.post("/api/studies", content=b"x" * (2 << 20), headers=AUTH),
        "export": client.get(f"/api/studies/{study}/export", params={"format": "env"}),
        "static": client.get("/static/favicon.svg"),
        "openapi": client.get("/openapi.json"),
        "page": client.get(f"/studies/{study}"),
        "docs": client.get("/docs"),
    }
    assert answers["too large"].status_code == 413 and answers["unauthorized"].status_code == 401
    for what, response in answers.items():
        assert response.headers.get("x-content-type-options") == "nosniff", what
        assert response.headers.get("x-frame-options") == "DENY", what
        assert response.headers.get("referrer-policy"), what
        assert response.headers.get("content-security-policy"), what
    assert answers["page"].headers["content-security-policy"] == CONTENT_SECURITY_POLICY  # the page keeps its own
    assert answers["list"].headers["content-security-policy"].startswith("default-src 'none'")


def _real_traceback() -> str:
    """A traceback through the project (its YAML writer) and PyYAML (installed), and a message naming a file."""
    import traceback

    import yaml

    from tuner.study.yamlio import dump_yaml

    try:
        dump_yaml({"a": object()})
    except yaml.YAMLError as exc:
        return "".join(traceback.format_exception(exc)) + (
            "\nwhile reading /srv/landscapes/softmax.jsonl, see https://example.org/a/b and tuner/x.py"
        )
    raise AssertionError("no error")


def test_trial_errors_are_served_without_server_paths(client: TestClient) -> None:
    import sys

    from sqlalchemy import text

    db: StudyDB = client.app.state.db
    study = noop_study(db, "paths", {"tile": 64})
    db.insert_trial(study, 1, {"tile": 32}, optuna_trial_id=None)
    error = _real_traceback()
    assert "/yaml/" in error and str(Path(__file__).resolve().parents[1]) in error  # it names absolute paths
    with db.engine.begin() as conn:
        conn.execute(
            text("UPDATE tuner_trials SET status = 'runtime_error', error = :e WHERE number = 1"), {"e": error}
        )
    served = [
        client.get(f"/api/studies/{study}/trials/1").json()["error"],
        client.get(f"/api/studies/{study}/trials", params={"status": "runtime_error"}).json()["items"][0]["error"],
        client.get(f"/api/studies/{study}/overview").json()["failures"][0]["error"],
    ]
    for shown in served:
        assert 'File "/' not in shown and "/srv/" not in shown and sys.prefix not in shown, shown
        assert 'File "tuner/study/yamlio.py"' in shown and 'File "yaml/' in shown and ".../softmax.jsonl" in shown
        assert "https://example.org/a/b" in shown and " tuner/x.py" in shown
