"""The analysis plots' endpoints (slice, contour, EDF, hypervolume history, best so far) on a real noop study run
by the engine, checked against the same figures computed directly from its trials; and on a 10,000-trial
study, each answering with a bounded response."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from tuner.store.storage import StudyDB
from tuner.study.spec import load_spec

pytestmark = [pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parent.parent
SPEC = {
    "name": "plots",
    "workload": "noop",
    "space": {"tile": {"high": 128}, "stages": {"high": 4}},
    "objectives": [{"metric": "score"}, {"metric": "cost"}],
    "constraints": ["score >= 0.2"],
    "budget": {"trials": 30},
    "sampler": "random",
    "seed": 3,
    "warm_start": False,
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> tuple[str, int]:
    from tuner.run.orchestrator import Orchestrator

    url = str(tmp_path_factory.mktemp("plots") / "plots.db")
    db = StudyDB(url)
    summary = Orchestrator(load_spec(SPEC), db, workers=2).run()
    db.dispose()
    return url, summary.study_id


@pytest.fixture(scope="module")
def client(study: tuple[str, int]) -> TestClient:
    app = create_app(Settings(db_url=study[0]))
    with TestClient(app) as c:
        yield c
    app.state.db.dispose()


def ok_trials(client: TestClient, study_id: int) -> list[Any]:
    trials = client.app.state.db.trials(study_id)
    return sorted((t for t in trials if t.status == "ok" and t.duplicate_of is None), key=lambda t: t.number)


def test_slice_is_each_trials_knob_value_and_objective(client: TestClient, study: tuple[str, int]) -> None:
    sid = study[1]
    trials = ok_trials(client, sid)
    body = client.get(f"/api/studies/{sid}/slice", params={"param": "x", "color": "mode"}).json()
    assert body["kind"] == "numeric" and body["objective"] == "score" and body["stride"] == 1
    expected = [(t.number, t.params["x"], t.metrics["score"], t.params["mode"], t.feasible) for t in trials]
    got = [(p["number"], p["value"], p["objective"], p["group"], p["feasible"]) for p in body["points"]]
    assert got == expected and len(got) >= 20
    by_mode = client.get(f"/api/studies/{sid}/slice", params={"param": "mode", "objective": "cost"}).json()
    assert by_mode["kind"] == "categorical"
    assert [(p["value"], p["objective"]) for p in by_mode["points"]] == [
        (t.params["mode"], t.metrics["cost"]) for t in trials
    ]
    assert client.get(f"/api/studies/{sid}/slice", params={"param": "nope"}).status_code == 422
    assert client.get(f"/api/studies/{sid}/slice", params={"param": "x", "color": "x"}).status_code == 422
    assert client.get(f"/api/studies/{sid}/slice", params={"param": "x", "objective": "y"}).status_code == 422


def test_contour_cells_hold_the_best_value_of_their_trials(client: TestClient, study: tuple[str, int]) -> None:
    sid = study[1]
    trials = ok_trials(client, sid)
    body = client.get(f"/api/studies/{sid}/contour", params={"x": "x", "y": "mode", "bins": 4}).json()
    assert body["y_cells"] == ["fast", "balanced", "exact"] and len(body["x_cells"]) == 4
    assert body["count"] == len(trials)
    for i, mode in enumerate(body["y_cells"]):
        for j in range(4):
            # the noop space's x is in [0, 1]: cell j holds j/4 <= x < (j+1)/4 (x = 1 in the last)
            inside = [
                t.metrics["score"] for t in trials if t.params["mode"] == mode and min(3, int(t.params["x"] * 4)) == j
            ]
            assert body["z"][i][j] == (max(inside) if inside else None)
    assert client.get(f"/api/studies/{sid}/contour", params={"x": "x", "y": "x"}).status_code == 422


def test_edf_is_the_sorted_values_and_their_fractions(client: TestClient, study: tuple[str, int]) -> None:
    sid = study[1]
    trials = ok_trials(client, sid)
    curves = client.get(f"/api/studies/{sid}/edf").json()["curves"]
    assert [c["metric"] for c in curves] == ["score", "cost"]
    for curve in curves:
        values = sorted(t.metrics[curve["metric"]] for t in trials)
        assert curve["values"] == values and curve["fraction"] == [(i + 1) / len(values) for i in range(len(values))]
    short = client.get(f"/api/studies/{sid}/edf", params={"limit": 5}).json()["curves"][0]
    assert (
        len(short["values"]) == 5
        and short["fraction"][-1] == 1.0
        and short["values"][0] == min(t.metrics["score"] for t in trials)
    )
    grouped = client.get(f"/api/studies/{sid}/edf", params={"color": "mode"}).json()["curves"]
    assert sum(c["count"] for c in grouped if c["metric"] == "score") == len(trials)
    assert {c["group"] for c in grouped} == {t.params["mode"] for t in trials}


def sweep_volume(points: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """The area dominated by ``points`` (smaller is better) inside ``ref``: a sweep over every point by the
    first value, the running minimum of the second (no front is built)."""
    inside = sorted(p for p in points if p[0] < ref[0] and p[1] < ref[1])
    area, low = 0.0, ref[1]
    for i, (a, b) in enumerate(inside):
        low = min(low, b)
        right = inside[i + 1][0] if i + 1 < len(inside) else ref[0]
        area += (right - a) * (ref[1] - low)
    return area


def test_hypervolume_history_matches_a_direct_sweep(client: TestClient, study: tuple[str, int]) -> None:
    sid = study[1]
    feasible = [t for t in ok_trials(client, sid) if t.feasible]
    body = client.get(f"/api/studies/{sid}/hypervolume").json()
    ref = body["reference_point"]
    scores, costs = [t.metrics["score"] for t in feasible], [t.metrics["cost"] for t in feasible]
    assert ref["score"] == pytest.approx(min(scores) - 0.1 * (max(scores) - min(scores)))
    assert ref["cost"] == pytest.approx(max(costs) + 0.1 * (max(costs) - min(costs)))
    key_ref = (-ref["score"], ref["cost"])
    for point in body["history"]:
        prefix = [(-t.metrics["score"], t.metrics["cost"]) for t in feasible if t.number <= point["number"]]
        assert point["hypervolume"] == pytest.approx(sweep_volume(prefix, key_ref))
    volumes = [p["hypervolume"] for p in body["history"]]
    assert volumes == sorted(volumes) and volumes[-1] > 0 and body["history"][-1]["number"] == feasible[-1].number
    fixed = client.get(f"/api/studies/{sid}/hypervolume", params={"ref": "0,10"}).json()
    assert fixed["reference_point"] == {"score": 0.0, "cost": 10.0}
    assert fixed["hypervolume"] == pytest.approx(
        sweep_volume([(-s, c) for s, c in zip(scores, costs, strict=True)], (0.0, 10.0))
    )
    assert client.get(f"/api/studies/{sid}/hypervolume", params={"ref": "1"}).status_code == 422


def test_best_so_far_by_trial_and_by_wall_time(client: TestClient, study: tuple[str, int]) -> None:
    sid = study[1]
    feasible = [t for t in ok_trials(client, sid) if t.feasible]
    score = client.get(f"/api/studies/{sid}/best").json()["objectives"][0]
    assert score["metric"] == "score" and score["count"] == len(feasible)
    best, expected = -math.inf, []
    for t in feasible:
        if t.metrics["score"] > best:
            best = t.metrics["score"]
            expected.append((t.number, best))
    assert [(p["number"], p["best"]) for p in score["by_trial"][: len(expected)]] == expected
    assert score["by_trial"][-1] == {"number": feasible[-1].number, "x": feasible[-1].number, "best": best}
    times = [p["x"] for p in score["by_time"]]
    assert times == sorted(times) and times[0] >= 0 and score["by_time"][-1]["best"] == best


def test_hypervolume_of_one_objective_is_a_clear_422(client: TestClient) -> None:
    db: StudyDB = client.app.state.db
    compiled = load_spec({**SPEC, "name": "single", "objectives": [{"metric": "score"}]})
    row = db.create_study(
        name="single",
        workload="noop",
        spec=compiled.spec.model_dump(mode="json"),
        space=compiled.space.canonical,
        space_hash=compiled.space.hash,
        status="completed",
        objectives=compiled.objectives,
    )
    response = client.get(f"/api/studies/{row.id}/hypervolume")
    assert response.status_code == 422 and "two objectives" in response.text


def test_every_plot_endpoint_is_bounded_at_10000_trials(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from api_scale import write_storage_study

    url = str(tmp_path / "scale.db")
    made = StudyDB(url)
    made.create_tables()
    made.dispose()
    written = write_storage_study(url, 10000)
    app = create_app(Settings(db_url=url))
    sid = written["study_id"]
    requests = {
        "slice": ("slice", {"param": "x", "color": "mode", "limit": 500}, lambda b: len(b["points"]) <= 501),
        "contour": ("contour", {"x": "x", "y": "tile", "limit": 500}, lambda b: len(b["points"]) <= 501),
        "edf": ("edf", {"color": "mode", "limit": 100}, lambda b: all(len(c["values"]) <= 101 for c in b["curves"])),
        "hypervolume": ("hypervolume", {"limit": 200}, lambda b: 0 < len(b["history"]) <= 201),
        "best": ("best", {"limit": 200}, lambda b: all(len(o["by_trial"]) <= 201 for o in b["objectives"])),
    }
    with TestClient(app) as c:
        for name, (path, params, bounded) in requests.items():
            c.get(f"/api/studies/{sid}/{path}", params=params)  # warm the connection pool
            start = time.perf_counter()
            response = c.get(f"/api/studies/{sid}/{path}", params=params)
            elapsed = (time.perf_counter() - start) * 1000
            assert response.status_code == 200, response.text
            assert bounded(response.json()) and len(response.content) < 200_000, name
            print(f"{name}: {elapsed:.0f} ms, {len(response.content)} bytes at 10,000 trials")
    app.state.db.dispose()


def test_notes_are_written_with_the_token_read_back_and_exported(study: tuple[str, int]) -> None:
    url, sid = study
    app = create_app(Settings(db_url=url, token="note-token"))
    auth = {"Authorization": "Bearer note-token"}
    with TestClient(app) as c:
        trial = ok_trials(c, sid)[0].number
        assert c.put(f"/api/studies/{sid}/note", json={"text": "no token"}).status_code == 401
        assert c.put(f"/api/studies/{sid}/trials/{trial}/note", json={"text": "x"}).status_code == 401
        study_note = "# Driver 550\nThe *fast* mode wins at tile 64."
        put = c.put(f"/api/studies/{sid}/note", json={"text": study_note}, headers=auth)
        assert put.status_code == 200 and put.json()["text"] == study_note
        assert (
            c.put(f"/api/studies/{sid}/trials/{trial}/note", json={"text": "re-check"}, headers=auth).status_code == 200
        )
        assert c.put(f"/api/studies/{sid}/trials/99999/note", json={"text": "x"}, headers=auth).status_code == 404
        too_long = c.put(f"/api/studies/{sid}/note", json={"text": "x" * 10_001}, headers=auth)
        assert too_long.status_code == 422
        assert c.get(f"/api/studies/{sid}").json()["note"] == study_note
        assert c.get(f"/api/studies/{sid}/trials/{trial}").json()["note"] == "re-check"
        assert c.get(f"/api/studies/{sid}/overview").json()["study"]["note"] == study_note
        exported = c.get(f"/api/studies/{sid}/export", params={"format": "json"}).json()
        assert exported["notes"] == {"study": study_note, "trials": {str(trial): "re-check"}}
        assert c.put(f"/api/studies/{sid}/trials/{trial}/note", json={"text": ""}, headers=auth).status_code == 200
        assert c.get(f"/api/studies/{sid}/trials/{trial}").json()["note"] is None
    app.state.db.dispose()
