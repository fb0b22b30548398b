"""Shared fixtures: a local Ray for the session, and study databases on SQLite and PostgreSQL.

PostgreSQL tests use ``TUNER_TEST_PG_URL`` (``scripts/test.sh`` starts the server and sets it).
Without it they are skipped, unless ``TUNER_REQUIRE_PG=1`` (CI), where they fail.
"""

from __future__ import annotations

import os
import shutil

# Kernels run under the Triton interpreter on machines without an NVIDIA GPU; on a GPU machine
# the GPU tests compile them for real (set TRITON_INTERPRET=1 yourself to force the interpreter).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _import_kernels() -> None:
    """Import every kernel module (and Gluon) now: a kernel is interpreted or compiled as TRITON_INTERPRET says
    when its module is first imported, and a test that sets TRITON_INTERPRET=0 for a while (as on a GPU, for
    static checks) must not be the one that first imports it."""
    import importlib
    import pkgutil

    import kernels

    for module in pkgutil.walk_packages(kernels.__path__, "kernels."):
        importlib.import_module(module.name)


_import_kernels()

PG_URL = os.environ.get("TUNER_TEST_PG_URL", "")
REPO = Path(__file__).resolve().parent.parent


def _reset_postgres(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


def postgres_url() -> str:
    if not PG_URL:
        if os.environ.get("TUNER_REQUIRE_PG") == "1":
            pytest.fail("TUNER_REQUIRE_PG=1 but TUNER_TEST_PG_URL is not set: PostgreSQL did not start")
        pytest.skip("no PostgreSQL: set TUNER_TEST_PG_URL (scripts/test.sh starts one)")
    _reset_postgres(PG_URL)
    return PG_URL


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty study database: an SQLite file, then a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return postgres_url()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture(scope="session", autouse=True)
def landscape_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory the ``replay`` workload may read landscapes from (``TUNER_LANDSCAPE_DIR``), for the
    landscapes tests record. Set before anything starts Ray, whose workers inherit the environment."""
    path = tmp_path_factory.mktemp("landscapes")
    before = os.environ.get("TUNER_LANDSCAPE_DIR")
    os.environ["TUNER_LANDSCAPE_DIR"] = str(path)
    yield path
    if before is None:
        os.environ.pop("TUNER_LANDSCAPE_DIR", None)
    else:
        os.environ["TUNER_LANDSCAPE_DIR"] = before


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole test session (starting one costs seconds)."""
    import ray

    from tuner.run.orchestrator import ensure_ray

    ensure_ray(None, min_cpus=4)
    yield
    ray.shutdown()


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-unsafe-swiftshader",
]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


#: Skip unless the kernels compile and run on a CUDA GPU (not under the Triton interpreter).
compiled_gpu = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or not _has_cuda(),
    reason="needs a CUDA GPU and compiled kernels (not the interpreter)",
)


def chromium_or_skip() -> str:
    """The Chromium binary, or skip (fail under TUNER_REQUIRE_BROWSER=1) when it or Playwright is missing."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    reason = None
    if path is None:
        reason = "no chromium binary (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "playwright is not installed (pip install playwright)"
    if reason is not None:
        if os.environ.get("TUNER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TUNER_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    return path


@pytest.fixture
def interpreter() -> None:
    """Skip unless Triton kernels run under the interpreter (TRITON_INTERPRET=1 before triton was imported)."""
    from kernels.gemm.gemm import matmul_kernel
    from tuner.workloads.contract import require_interpreter

    require_interpreter(matmul_kernel)


#: Put before every ``aot_child`` script: ``compile_or_skip(compile)`` returns ``compile()``'s kernel, or, when
#: this Triton cannot compile ahead of time (its internals, no ptxas), prints ``{"skip": reason}`` and ends the child;
#: ``sass_or_skip(kernel)`` returns the kernel's SASS (Triton's ``nvdisasm``), or skips where Triton ships none.
AOT_PRELUDE = """
import json as _json, sys as _sys
def compile_or_skip(compile):
    try:
        return compile()
    except NotImplementedError as exc:
        reason = str(exc)
    except (FileNotFoundError, PermissionError) as exc:
        reason = f"no ptxas to run: {exc}"
    print(_json.dumps({"skip": reason}), flush=True)
    _sys.exit(0)
def sass_or_skip(kernel):
    import os, subprocess, tempfile, triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if not os.path.exists(tool):
        print(_json.dumps({"skip": "this Triton ships no nvdisasm"}), flush=True)
        _sys.exit(0)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
"""


@pytest.fixture
def aot_child() -> Callable[..., list[dict]]:
    """Run a Python script in a child process without TRITON_INTERPRET (kernels compile, not interpret).

    The script (after :data:`AOT_PRELUDE`) prints one JSON object per line; a first line ``{"skip": reason}``
    (this Triton cannot compile ahead of time, no ptxas) skips the test. Returns the parsed lines once the
    child exited 0.
    """
    import json
    import subprocess
    import sys

    def run(script: str, *args: str, timeout: float) -> list[dict]:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is the default
        proc = subprocess.run(
            [sys.executable, "-c", AOT_PRELUDE + script, *args],
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if lines and "skip" in lines[0]:
            pytest.skip(f"no ahead-of-time compilation: {lines[0]['skip']}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        return lines

    return run
