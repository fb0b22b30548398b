"""A new user's first ten minutes: the set-up script, the demo's studies, the default database, the CLI's answers."""

from __future__ import annotations

import json
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


# ------------------------------------------------------------------------------------------ the demo's studies


def _demo_spec(name: str, **changes: object) -> dict:
    import yaml

    spec = yaml.safe_load((ROOT / "examples" / name).read_text())
    spec.update(changes)
    return spec


@pytest.fixture(scope="module")
def replayed_study(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> tuple[str, int]:
    """The demo's replay study (no per-trial delay) run on the engine: (database URL, study id)."""
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    spec = _demo_spec("demo-replay.yaml")  # one worker, as the demo: its trials come in a fixed order
    spec["args"] = {**spec["args"], "delay_ms": 0}
    url = f"sqlite:///{tmp_path_factory.mktemp('demo') / 'tuner.db'}"
    db = StudyDB(url)
    summary = Orchestrator(load_spec(spec), db).run()
    assert summary.status == "completed"
    return url, summary.study_id


def test_demo_specs_compile_with_fronts_to_find() -> None:
    """The three demo studies are valid; the live one keeps the quantizations whose bytes and error trade off."""
    from tuner.study.spec import load_spec

    replay = load_spec(ROOT / "examples" / "demo-replay.yaml")
    assert replay.spec.workload == "replay" and [m for m, _ in replay.objectives] == ["tflops", "max_rel_error"]
    live = load_spec(ROOT / "examples" / "demo-gemm.yaml")
    assert set(live.space.params["bits"].choices) == {4, 8} and len(live.space.params["group_size"].choices) >= 3
    assert [m for m, _ in live.objectives] == ["weight_bytes", "max_rel_error"]
    gpu = load_spec(ROOT / "examples" / "demo-gemm-gpu.yaml")
    assert set(gpu.space.params["precision"].choices) == {"fp32", "tf32", "bf16", "fp16", "fp8"}


def test_demo_replay_study_has_a_front_and_is_labelled_replayed(replayed_study: tuple[str, int]) -> None:
    from tuner.results.export import export_document, render
    from tuner.results.pareto import pareto_front
    from tuner.store.storage import StudyDB

    url, study_id = replayed_study
    db = StudyDB(url)
    row = db.get_study(study_id)
    front = pareto_front(db.trials(study_id), [("tflops", "maximize"), ("max_rel_error", "minimize")])
    assert len(front) > 1
    document = export_document(db, row)
    provenance = document["provenance"]
    assert provenance["kind"] == "replayed" and "NVIDIA H200" in provenance["note"]
    assert provenance["file"] == "bench/landscapes/quant_groups-m16-8192.jsonl"
    for fmt in ("yaml", "env", "python"):
        text = render(document, fmt)
        assert "# replayed, recorded on NVIDIA H200" in text, fmt
    assert document["timing_comparable"] is True and "timing_comparable: false" not in render(document, "python")


def test_demo_study_page_says_replayed_and_shows_the_token_box_only_when_needed(
    replayed_study: tuple[str, int],
) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings

    url, study_id = replayed_study
    with TestClient(create_app(Settings(db_url=url))) as client:
        page = client.get(f"/studies/{study_id}").text
    assert 'id="provenance-note"' in page and "Replayed, recorded on NVIDIA H200" in page
    assert 'data-writes-need-token="0"' in page and 'id="api-token"' not in page
    with TestClient(create_app(Settings(db_url=url, token="s3cret"))) as client:
        page = client.get(f"/studies/{study_id}").text
    assert 'data-writes-need-token="1"' in page and 'id="api-token"' in page


# ------------------------------------------------------------------------------------------ the CLI finds the study


def test_cli_names_the_database_it_searched_and_the_studies_it_has(
    replayed_study: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    url, study_id = replayed_study
    with pytest.raises(SystemExit) as exit_info:
        main(["trials", "demo-gemm-256", "--db", url])
    assert exit_info.value.code == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"no study named or numbered 'demo-gemm-256' in {url}" in said
    assert f"it has: demo-replay-h200-gemm (id {study_id})" in said
    assert main(["export", "demo-replay-h200-gemm", "--format", "env", "--db", url]) == 0
    assert "# replayed, recorded on NVIDIA H200" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ live figures


def test_elapsed_runs_on_while_the_lease_is_live_and_stops_with_it() -> None:
    import datetime as dt

    from tuner.store.progress import live_elapsed_s

    now = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.timezone.utc)
    written = now - dt.timedelta(seconds=30)
    lease = now + dt.timedelta(seconds=10)
    assert live_elapsed_s(5.0, "running", written, lease, now) == 35.0
    assert live_elapsed_s(5.0, "stopping", written, lease, now) == 35.0
    assert live_elapsed_s(5.0, "completed", written, None, now) == 5.0
    assert live_elapsed_s(5.0, "running", written, now - dt.timedelta(seconds=1), now) == 5.0  # a dead runner


def test_eta_is_the_earlier_of_the_trial_budget_and_the_minutes() -> None:
    import datetime as dt

    from tuner.store.progress import eta_s, recent_rate

    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    # 10 trials over the last 20 s: 0.5 trials/s, 10 trials to go: 20 s; the minutes leave more.
    finishes = [now - dt.timedelta(seconds=2 * i) for i in range(1, 11)]
    assert recent_rate(finishes, now) == 0.5
    assert eta_s(measured=10, budget_trials=20, elapsed_s=156, budget_minutes=10, rate_per_s=0.5) == 20.0
    # The same study at 1 trial a minute: the 10-minute budget ends first (444 s left of 600).
    assert eta_s(measured=10, budget_trials=20, elapsed_s=156, budget_minutes=10, rate_per_s=1 / 60) == 444.0
    # No rate yet: the mean over the run, else the minutes alone, else nothing to say.
    assert eta_s(measured=2, budget_trials=20, elapsed_s=10, budget_minutes=None, rate_per_s=None) == 90.0
    assert eta_s(measured=0, budget_trials=20, elapsed_s=10, budget_minutes=1, rate_per_s=None) == 50.0
    assert eta_s(measured=0, budget_trials=20, elapsed_s=10, budget_minutes=None, rate_per_s=None) is None
    assert recent_rate(finishes[:1], now) is None


# ------------------------------------------------------------------------------------------ offline API docs


@pytest.fixture
def api_client(tmp_path: Path):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings

    with TestClient(create_app(Settings(db_url=f"sqlite:///{tmp_path / 'api.db'}"))) as client:
        yield client


def test_docs_pages_load_their_assets_from_the_app_and_the_schema_has_a_bearer_scheme(api_client) -> None:
    import re

    for page, assets in (("/docs", {"swagger-ui-bundle.js", "swagger-ui.css"}), ("/redoc", {"redoc.standalone.js"})):
        html = api_client.get(page).text
        urls = re.findall(r'(?:src|href|url)\s*[=:]\s*["\']([^"\']+)["\']', html)
        assert urls and all(u.startswith("/") for u in urls), (page, urls)  # nothing from another origin
        assert "//" not in html.replace("://", "").replace("<!--", "") or "https://" not in html
        for name in assets:
            assert f"/docs-assets/{name}" in urls
            response = api_client.get(f"/docs-assets/{name}")
            assert response.status_code == 200 and len(response.content) > 10_000
    assert api_client.get("/docs-assets/../main.py").status_code == 404
    schema = api_client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert schema["paths"]["/api/studies"]["post"]["security"] == [{"bearer": []}]
    assert schema["paths"]["/api/studies/{study_id}/stop"]["post"]["security"] == [{"bearer": []}]


# ------------------------------------------------------------------------------------------ validation, all at once


BAD_SPEC = {
    "name": "bad name!",
    "workload": "triton_gemm",
    "args": {"m": 64, "n": 64, "kk": 64},
    "objectives": [{"metric": "tflopz"}],
    "constraints": ["max_rel_eror <= 0.1"],
    "space": {"BLOCK_Q": {"high": 3}, "num_warps": {"type": "pow2", "low": 3, "high": 8}},
    "budget": {"trials": 0},
}


def test_a_spec_gets_every_error_in_one_answer_with_the_workload_args_listed() -> None:
    from tuner.study.spec import SpecError, load_spec

    with pytest.raises(SpecError) as info:
        load_spec(BAD_SPEC)
    errors = dict(info.value.errors)
    assert set(errors) >= {
        "name",
        "budget.trials",
        "args.kk",
        "args.k",
        "objectives.0.metric",
        "constraints.0",
        "space.BLOCK_Q",
        "space.num_warps.low",
    }
    assert errors["args.kk"] == "unknown arg 'kk' (did you mean 'k'?); triton_gemm takes m, n, k, seed, timing"
    assert "missing required arg 'k'" in errors["args.k"]


def test_the_api_answers_every_error_of_a_spec_in_one_422(api_client) -> None:
    response = api_client.post("/api/studies", json=BAD_SPEC)
    assert response.status_code == 422
    locs = {".".join(map(str, e["loc"])) for e in response.json()["detail"]}
    assert {"body.name", "body.budget.trials", "body.args.kk", "body.objectives.0.metric", "body.space.BLOCK_Q"} <= locs


def test_a_space_without_a_statically_feasible_point_is_refused_at_submit(api_client) -> None:
    from tuner.study.spec import SpecError, load_spec

    spec = {
        "name": "warps-3",
        "workload": "triton_gemm",
        "args": {"m": 64, "n": 64, "k": 64},
        "objectives": [{"metric": "tflops"}],
        "space": {"num_warps": {"choices": [3]}},
    }
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    [(field, message)] = info.value.errors
    assert field == "space" and "no statically feasible config" in message and "num_warps=3" in message
    response = api_client.post("/api/studies", json=spec)
    assert response.status_code == 422 and "no statically feasible config" in response.text
    assert api_client.get("/api/studies").json()["total"] == 0  # nothing was queued
    # A space of 10**12 values per param is sampled, never listed: its refusal is as quick as a small one's.
    spec["space"] = {"num_warps": {"choices": [3]}, "num_stages": {"low": 1, "high": 10**12}}
    with pytest.raises(SpecError, match="none of 2000 points sampled"):
        load_spec(spec)
    spec["space"] = {"num_warps": {"choices": [4]}}
    assert load_spec(spec).spec.name == "warps-3"


def test_sampled_points_come_from_the_space_and_enumeration_is_exhaustive_when_small() -> None:
    from tuner.study.space import compile_space

    space = compile_space(
        {
            "params": {
                "tile": {"type": "pow2", "low": 16, "high": 64},
                "mode": {"type": "categorical", "choices": ["a", "b"]},
                "split": {"type": "int", "low": 1, "high": 4, "when": "mode == 'b'"},
            }
        }
    )
    points, exhaustive = space.sample_points(100)
    points = list(points)
    assert exhaustive and len(points) == 3 * 2 * 4  # the combinations; those of an inactive param repeat
    assert {json.dumps(p, sort_keys=True) for p in points} == {json.dumps(p, sort_keys=True) for p in space.grid()}
    huge = compile_space(
        {"params": {"n": {"type": "int", "low": 0, "high": 10**15}, "x": {"type": "float", "low": 0.5, "high": 2.0}}}
    )
    drawn, exhaustive = huge.sample_points(50)
    assert not exhaustive and all(huge.validate_config(p) is None for p in drawn)


def test_trial_filters_and_sort_keys_are_checked(replayed_study: tuple[str, int]) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings

    url, study_id = replayed_study
    with TestClient(create_app(Settings(db_url=url))) as client:
        base = f"/api/studies/{study_id}"
        assert client.get(f"{base}/trials", params={"status": "okk"}).status_code == 422
        wrong = client.get(f"{base}/trials", params={"sort": "-tflopz"})
        assert wrong.status_code == 422 and "tflops" in wrong.json()["detail"][0]["msg"]
        assert client.get(f"{base}/overview", params={"sort": "tflopz"}).status_code == 422
        best = client.get(f"{base}/trials", params={"sort": "-tflops", "status": "ok", "limit": 1}).json()
        assert best["items"][0]["status"] == "ok"
    completed = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "trials", str(study_id), "--status", "timout", "--db", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and "invalid choice: 'timout'" in completed.stderr


# ------------------------------------------------------------------------------ one vocabulary, real literals


def test_one_vocabulary_on_the_page_the_cli_and_the_readme() -> None:
    """A statically rejected config is "statically infeasible", never "pruned" (Optuna's PRUNED stops a running
    trial); a config answered from an earlier trial is a "duplicate"."""
    sources = [
        *sorted((ROOT / "api" / "static" / "js").glob("*.js")),
        *sorted((ROOT / "api" / "templates").glob("*.html")),
        ROOT / "tuner" / "cli" / "main.py",
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
    ]
    for path in sources:
        text = path.read_text().lower()
        for word in ("pruned statically", "statically pruned", "static-pruned", "repeat of", " repeats"):
            assert word not in text, (path.name, word)


def test_exports_of_an_interpreter_trial_carry_the_caveat_and_real_literals(tmp_path: Path) -> None:
    import ast

    from tuner.results.export import export_document, render
    from tuner.store.storage import StudyDB

    db = StudyDB(f"sqlite:///{tmp_path / 'export.db'}")
    db.create_tables()
    spec = {
        "name": "interp",
        "workload": "triton_gemm",
        "args": {"m": 96, "n": 96, "k": 96},
        "objectives": [{"metric": "tflops"}, {"metric": "max_rel_error"}],
    }
    row = db.create_study(
        name="interp", workload="triton_gemm", status="completed", space={}, space_hash="0", spec=spec
    )
    params = {
        "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
        "precision": "fp16", "pad_k": True, "kernel": "tutorial",
    }  # fmt: skip
    db.insert_trial(row.id, 0, params, optuna_trial_id=None)
    db.finish_trial(
        row.id, 0, status="ok", metrics={"tflops": 0.01, "max_rel_error": 1e-3}, samples_ms=[1.0], feasible=True,
        timing_comparable=False, error=None, worker="w0.0", attempt=1, fingerprint={"triton_interpret": True},
    )  # fmt: skip
    document = export_document(db, db.get_study(row.id))
    env = render(document, "env")
    assert "# timing_comparable: false" in env and "PAD_K=1\n" in env and "False" not in env and "True" not in env
    python = render(document, "python")
    assert "# timing_comparable: false" in python
    ast.parse(python)
    assert render(document, "yaml").startswith("# timing_comparable: false")
    assert '"timing_comparable": false' in render(document, "json")
