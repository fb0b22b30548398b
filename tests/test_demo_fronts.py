"""The demo's studies on a CPU: the replay study picks the front's knee and says where its figures were measured
(replayed, recorded on the landscape's GPU: fingerprint, export, hardware panel); the live study's front has
several points; the plots' ticks are plain numbers."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LANDSCAPE = ROOT / "bench" / "landscapes" / "quant_groups-m16-8192.jsonl"


def _run(spec: dict, url: str) -> int:
    from tuner.run.orchestrator import Orchestrator
    from tuner.store.storage import StudyDB
    from tuner.study.spec import load_spec

    summary = Orchestrator(load_spec(spec), StudyDB(url)).run()
    assert summary.status == "completed"
    return summary.study_id


@pytest.fixture(scope="module")
def replay_demo(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> tuple[str, int]:
    spec = yaml.safe_load((ROOT / "examples" / "demo-replay.yaml").read_text())
    spec["args"] = {**spec["args"], "delay_ms": 0}
    url = f"sqlite:///{tmp_path_factory.mktemp('replay') / 'tuner.db'}"
    return url, _run(spec, url)


def _landscape_knee(limit: float) -> dict[str, float]:
    """The recorded config of most TFLOP/s among those within ``limit`` error: the front's knee."""
    records = [json.loads(line) for line in LANDSCAPE.read_text().splitlines()[1:] if line.strip()]
    ok = [r["metrics"] for r in records if r["status"] == "ok" and r["metrics"]["max_rel_error"] <= limit]
    return max(ok, key=lambda m: m["tflops"])


def test_the_replay_demo_picks_the_knee_not_the_int4_corner(replay_demo: tuple[str, int]) -> None:
    from tuner.results.export import export_document
    from tuner.store.storage import StudyDB

    url, study_id = replay_demo
    db = StudyDB(url)
    document = export_document(db, db.get_study(study_id))
    assert document["spec"]["constraints"] == ["max_rel_error <= 0.01"]
    knee = _landscape_knee(0.01)
    assert document["metrics"]["tflops"] == pytest.approx(knee["tflops"])
    assert document["metrics"]["max_rel_error"] == pytest.approx(knee["max_rel_error"])
    # The unconstrained corner (int4, ~13% error) is faster: the constraint is what keeps it from being the pick.
    fastest = max((t for t in db.trials(study_id) if t.status == "ok"), key=lambda t: t.metrics["tflops"])
    assert fastest.metrics["tflops"] > knee["tflops"] and fastest.metrics["max_rel_error"] > 0.1


def test_a_replayed_study_names_the_recorded_gpu_and_says_replayed(replay_demo: tuple[str, int]) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from api.settings import Settings
    from tuner.results.export import export_document, render
    from tuner.store.storage import StudyDB

    url, study_id = replay_demo
    db = StudyDB(url)
    document = export_document(db, db.get_study(study_id))
    fingerprint = document["fingerprint"]
    assert fingerprint["replayed"] is True and fingerprint["measured"] == "replayed, recorded on NVIDIA H200"
    assert fingerprint["gpu_names"] == ["NVIDIA H200"] and fingerprint["device_kind"] == "cuda"
    assert fingerprint["replayed_on"].endswith("(cpu)")  # the host that answered the trials, apart
    assert document["timing_comparable"] is True  # the recorded H200 timings, stated as replayed
    for fmt in ("yaml", "env", "python", "json"):
        assert "replayed, recorded on NVIDIA H200" in render(document, fmt), fmt
    with TestClient(create_app(Settings(db_url=url))) as client:
        study = client.get(f"/api/studies/{study_id}").json()  # what the hardware panel shows
        page = client.get(f"/studies/{study_id}").text
    assert study["fingerprint"]["replayed"] is True and study["fingerprint"]["gpu_names"] == ["NVIDIA H200"]
    assert "Replayed, recorded on NVIDIA H200" in page
    cards = (ROOT / "api" / "static" / "js" / "cards.js").read_text()
    assert "fp.replayed" in cards and "fp.measured" in cards


def test_the_live_demo_front_has_at_least_three_points(tmp_path: Path, ray_session: None) -> None:
    from tuner.results.pareto import pareto_front
    from tuner.store.storage import StudyDB

    spec = yaml.safe_load((ROOT / "examples" / "demo-gemm.yaml").read_text())
    url = f"sqlite:///{tmp_path / 'live.db'}"
    study_id = _run(spec, url)
    objectives = [(o["metric"], o["direction"]) for o in spec["objectives"]]
    front = pareto_front(StudyDB(url).trials(study_id), objectives)
    points = {tuple(t.metrics[m] for m, _ in objectives) for t in front}
    assert len(points) >= 3, points


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to import the dashboard's module")
def test_plot_axes_format_ticks_as_plain_numbers(tmp_path: Path) -> None:
    """Every axis a plot uses gets "~g" ticks (no SI suffix: "80µ" TFLOP/s); its own format and category axes stay."""
    script = tmp_path / "ticks.mjs"
    script.write_text(
        'globalThis.document = { getElementById: () => null, readyState: "complete" }; globalThis.window = {};\n'
        f'const {{ plainTicks }} = await import("{(ROOT / "api" / "static" / "js" / "draw.js").as_uri()}");\n'
        "const layout = { xaxis: { title: 'a' }, yaxis: { type: 'category' },\n"
        "  scene: { zaxis: { tickformat: '.2f' } } };\n"
        "console.log(JSON.stringify(plainTicks([{ x: [1], y: [2], xaxis: 'x2' }], layout)));\n"
    )
    out = json.loads(subprocess.run(["node", str(script)], capture_output=True, text=True, check=True).stdout)
    assert out["xaxis"] == {"tickformat": "~g", "hoverformat": "~g", "title": "a"}
    assert out["xaxis2"]["tickformat"] == "~g" and out["yaxis"] == {"type": "category"}
    assert out["scene"]["xaxis"]["tickformat"] == "~g" and out["scene"]["zaxis"]["tickformat"] == ".2f"
