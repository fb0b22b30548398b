"""The registry over HTTP: ``/api/configs`` (lookup, list, publish, retract, nccl_tuner.conf), the stdlib
client against a running server and from its offline cache, its ``triton.Config`` list in a real
``@triton.autotune`` kernel under the interpreter, and ``tuner lookup`` / ``tuner publish``."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_configs import CPU, gemm_config, measured_study

from api.main import create_app
from api.settings import Settings
from tuner.best_configs import registry as configs
from tuner.cli import main
from tuner.client import ConfigNotFound, RegistryClient
from tuner.store.storage import StudyDB

pytestmark = pytest.mark.timeout(300)
TOKEN = "registry-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PORTS = range(8740, 8750)
NCCL = {
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    "NCCL_MIN_NCHANNELS": 16,
    "NCCL_MAX_NCHANNELS": 32,
    "NCCL_BUFFSIZE": "default",
    "NCCL_NTHREADS": "default",
}


def _port() -> int:
    for port in PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 8740-8749")


def fill(db: StudyDB) -> None:
    """GEMM entries at three shapes on the interpreter (cpu), and two collective entries on a GPU."""
    db.create_tables()
    tiles = {256: dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), 1024: dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16)}
    tiles[4096] = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    for size, tile in tiles.items():
        args = {"m": size, "n": size, "k": size}
        cfg = gemm_config(**tile, GROUP_M=4, num_warps=2, num_stages=1)
        configs.publish(db, measured_study(db, f"gemm-{size}", args, [(cfg, size / 1000)], device=CPU))
    for size, proto in ((2**20, "LL128"), (2**26, "Simple")):
        args = {"op": "all_reduce", "size_bytes": size, "world_size": 8}
        study = measured_study(
            db, f"ar-{size}", args, [({**NCCL, "NCCL_PROTO": proto}, 100.0)], workload="collective", metric="busbw_gbps"
        )
        configs.publish(db, study)


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """A real HTTP server (uvicorn in a thread) over a filled registry; yields its base URL."""
    app = create_app(Settings(db_url=db_url, token=TOKEN))
    fill(app.state.db)
    with serving(app) as url:
        yield url


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app served by uvicorn in a thread on a free port, for the block; yields its base URL."""
    import uvicorn

    port = _port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uv.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        app.state.db.dispose()


def test_the_api_looks_up_lists_publishes_and_retracts(server: str) -> None:
    import httpx

    with httpx.Client(base_url=server, timeout=30) as http:
        exact = http.get(
            "/api/configs", params={"workload": "triton_gemm", "m": 1024, "n": 1024, "k": 1024, "gpu": "cpu"}
        )
        assert exact.status_code == 200 and exact.json()["exact"] is True and exact.json()["shape"]["m"] == 1024
        near = http.get(
            "/api/configs", params={"workload": "triton_gemm", "m": 1500, "n": 1500, "k": 1500, "gpu": "cpu", "top": 2}
        ).json()
        assert near["exact"] is False and [m["shape"]["m"] for m in near["matches"]] == [1024, 4096]
        assert near["matches"][0]["distance"] == pytest.approx(3**0.5 * math.log2(1500 / 1024))
        gpu = http.get("/api/configs", params={"workload": "triton_gemm", "m": 1024, "n": 1024, "k": 1024})
        assert gpu.status_code == 404 and "on any GPU" in gpu.json()["detail"]  # cpu entries stay out
        missing = http.get("/api/configs", params={"workload": "triton_gemm", "m": 1024})
        assert missing.status_code == 422 and {e["loc"][1] for e in missing.json()["detail"]} == {"n", "k"}
        assert http.get("/api/configs", params={"workload": "nope"}).status_code == 404
        fp16 = {"workload": "triton_gemm", "m": 1024, "n": 1024, "k": 1024, "gpu": "cpu", "precision": "bf16"}
        assert http.get("/api/configs", params=fp16).status_code == 404  # a fixed arg no entry has

        listed = http.get("/api/configs/entries", params={"workload": "triton_gemm", "m": 4096}).json()
        assert listed["total"] == 1 and listed["items"][0]["study"] == "gemm-4096"
        entry_id = listed["items"][0]["id"]
        assert http.get(f"/api/configs/{entry_id}").json()["trial"] == 0
        assert http.delete(f"/api/configs/{entry_id}").status_code == 401
        assert http.delete(f"/api/configs/{entry_id}", headers=AUTH).status_code == 204
        assert http.get(f"/api/configs/{entry_id}").status_code == 404
        again = http.post("/api/configs", json={"study": "gemm-4096"}, headers=AUTH).json()
        assert again["action"] == "added" and again["entry"]["shape"]["m"] == 4096
        assert http.post("/api/configs", json={"study": "nope"}, headers=AUTH).status_code == 404

        retune = f"/api/configs/{again['entry']['id']}/retune"
        assert http.post(retune).status_code == 401
        queued = http.post(retune, headers=AUTH)
        assert queued.status_code == 202 and queued.json()["name"].startswith("gemm-4096-retune-")
        study = http.get(queued.json()["url"]).json()
        assert study["status"] == "queued" and study["workload"] == "triton_gemm"
        assert http.post("/api/configs/999999/retune", headers=AUTH).status_code == 404

        conf = http.get("/api/configs/nccl_tuner.conf")
        assert conf.status_code == 200
        rows = [line.split(",") for line in conf.text.splitlines() if not line.startswith("#")]
        assert [(r[0], r[3], r[4], r[7]) for r in rows] == [
            ("allreduce", "ring", "ll128", "8"),
            ("allreduce", "ring", "simple", "8"),
        ]


def test_the_client_against_a_running_server_then_from_its_offline_cache(server: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache.json"
    client = RegistryClient(server, cache_path=cache, gpu="cpu")
    kwargs = client.best_config("triton_gemm", m=1000, n=1000, k=1000)
    assert kwargs == {
        "BLOCK_M": 32,
        "BLOCK_N": 16,
        "BLOCK_K": 16,
        "GROUP_M": 4,
        "num_warps": 2,
        "num_stages": 1,
        "precision": "fp16",
    }
    env = client.nccl_env("all_reduce", 2**25, 8, gpu="NVIDIA H200")
    assert env["NCCL_PROTO"] == "Simple" and env["NCCL_MAX_NCHANNELS"] == "32" and "NCCL_BUFFSIZE" not in env
    conf = client.nccl_tuner_conf(tmp_path / "nccl_tuner.conf", gpu="NVIDIA H200")
    assert (tmp_path / "nccl_tuner.conf").read_text() == conf and "allreduce" in conf
    with pytest.raises(ConfigNotFound, match="on NVIDIA A100"):
        client.best_config("triton_gemm", m=1000, n=1000, k=1000, gpu="NVIDIA A100")
    assert len(json.loads(cache.read_text())) == 3  # every answer is kept

    # The same questions with the server gone (a port nobody listens on), and offline by choice.
    dead = RegistryClient("http://127.0.0.1:9", cache_path=cache, gpu="cpu", timeout_s=2)
    assert dead.best_config("triton_gemm", m=1000, n=1000, k=1000) == kwargs
    offline = RegistryClient(server, cache_path=cache, offline=True)
    assert offline.nccl_env("all_reduce", 2**25, 8, gpu="NVIDIA H200") == env
    with pytest.raises(ConfigNotFound, match="has no answer"):
        dead.best_config("triton_gemm", m=64, n=64, k=64)


def test_the_client_imports_nothing_heavy() -> None:
    code = (
        "import sys, tuner.client; heavy = {'torch', 'triton', 'sqlalchemy', 'fastapi', 'pydantic', 'httpx', 'numpy'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def cpu_bench(fn: Any, quantiles: Any = None, **_: Any) -> list[float]:
    """Triton's autotuner times with the device's benchmarker; under the interpreter there is none."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return [min(times)] * 3


def test_autotune_configs_drive_a_real_triton_autotune_kernel(interpreter: None, server: str, tmp_path: Path) -> None:
    import torch
    import triton
    import triton.language as tl

    client = RegistryClient(server, cache_path=tmp_path / "cache.json", gpu="cpu")
    candidates = client.autotune_configs("triton_gemm", m=1024, n=1024, k=1024, k_configs=3)  # 256 and 4096 near
    assert [type(c) for c in candidates] == [triton.Config] * 3
    assert candidates[0].kwargs == {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}  # the exact entry
    assert {c.num_warps for c in candidates} == {2}

    @triton.autotune(configs=candidates, key=["M", "N", "K"], do_bench=cpu_bench)
    @triton.jit
    def matmul(a, b, c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        grid_n = tl.cdiv(N, BLOCK_N)
        group = GROUP_M * grid_n
        first_m = (pid // group) * GROUP_M
        size_m = min(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
        pid_m = first_m + (pid % group) % size_m
        pid_n = (pid % group) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            y = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    m, n, k = 40, 24, 48
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    matmul[grid](a, b, out, m, n, k)
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    assert matmul.best_config in candidates and len(matmul.configs_timings) == 3


def test_tuner_lookup_and_publish_on_the_database(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = StudyDB(db_url)
    fill(db)
    assert main(["lookup", "triton_gemm", "m=1500", "n=1500", "k=1500", "--gpu", "cpu", "--top", "2", "--json",
                 "--db", db_url]) == 0  # fmt: skip
    answer = json.loads(capsys.readouterr().out)
    assert answer["exact"] is False and [m["shape"]["m"] for m in answer["matches"]] == [1024, 4096]
    assert main(["lookup", "triton_gemm", "m=2048", "n=2048", "k=2048", "--db", db_url]) == 2
    assert "no triton_gemm entry on any GPU" in capsys.readouterr().err
    assert main(["publish", "gemm-256", "--trial", "0", "--db", db_url]) == 0
    assert "replaced entry" in capsys.readouterr().out
    assert main(["publish", "gemm-256", "--trial", "5", "--db", db_url]) == 2
    db.dispose()
