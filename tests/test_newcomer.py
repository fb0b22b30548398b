"""A new user's first ten minutes: the set-up script, the demo's studies, the default database, the CLI's answers."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fake_venv(tmp: Path) -> Path:
    """A venv whose ``python`` records ``-m pip`` calls instead of installing, and runs everything else with the
    test's interpreter (which has the project's dependencies)."""
    bin_dir = tmp / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$@" >> {tmp / "pip.log"}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    return tmp / "venv"


def _setup(tree: Path, venv: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNER_VENV": str(venv), "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=tree, env=env, capture_output=True, text=True, timeout=240, check=True
    )


def test_setup_reports_each_step_and_installs_nothing_the_second_time(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tree / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    venv = _fake_venv(tmp_path)
    log = tmp_path / "pip.log"

    first = _setup(tree, venv)
    steps = [line for line in first.stderr.splitlines() if line.startswith("setup [")]
    assert any("installing the project" in s for s in steps) and any("checking the imports" in s for s in steps)
    assert "set up: torch" in first.stdout
    assert "install -q -e .[dev,postgres]" in log.read_text()
    assert "WARNING" not in first.stderr and "notice" not in first.stderr

    log.unlink()
    second = _setup(tree, venv)
    assert "nothing to install" in second.stderr
    assert not log.exists()  # no pip call at all

    (tree / "pyproject.toml").write_text((tree / "pyproject.toml").read_text() + "\n# changed\n")
    third = _setup(tree, venv)
    assert "nothing to install" not in third.stderr
    assert "install -q -e .[dev,postgres]" in log.read_text()
