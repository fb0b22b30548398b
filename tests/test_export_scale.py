"""The export of a 10,000-trial study reads the front and the pick its summary keeps (issue #61 item 2,
issue #62 item 1): the same document as the full scan through ``pareto.py`` gave, in a bounded number of
statements that never select the study's trials as a whole."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from tuner.best_configs.registry import _winner
from tuner.results.export import export_document
from tuner.results.pareto import best_trial, pareto_front
from tuner.store.storage import StudyDB, TrialWrite

N_TRIALS = 10_000
OBJECTIVES = [("score", "maximize"), ("cost", "minimize")]


def _finish(db: StudyDB, study_id: int, number: int, status: str, metrics: dict[str, float], feasible: bool) -> Any:
    return db.finish_op(
        study_id,
        number,
        status=status,
        metrics=metrics,
        feasible=feasible,
        timing_comparable=False,
        error=None if status == "ok" else "failed on purpose",
        worker="test",
        attempt=1,
        fingerprint={"hostname": "test"},
    )


def _write_study(db: StudyDB) -> int:
    """10,000 trials through ``StudyDB.apply`` in batches: mostly ``ok``, some failed or infeasible, a few
    with equal objective values (ties on the front), then the top of the front re-measured."""
    spec = {
        "name": "big",
        "workload": "noop",
        "args": {},
        "objectives": [{"metric": m, "direction": d} for m, d in OBJECTIVES],
        "budget": {"trials": N_TRIALS},
    }
    row = db.create_study(
        name="big", workload="noop", spec=spec, space={}, space_hash="h", status="completed", objectives=OBJECTIVES
    )
    rng = random.Random(3)
    for first in range(0, N_TRIALS, 500):
        writes = []
        for number in range(first, first + 500):
            score = round(rng.random(), 3)  # rounded: distinct trials with equal values
            metrics = {"score": score, "cost": round(score + rng.uniform(-0.05, 0.05), 3), "latency_ms": 1.0}
            status = "failed" if number % 97 == 0 else "ok"
            writes.append(db.insert_op(row.id, number, {"x": number}, optuna_trial_id=None))
            writes.append(_finish(db, row.id, number, status, metrics, feasible=number % 89 != 0))
        db.apply(writes)
    # Re-measure three front points: the pick then goes by their medians, not by the front's first.
    front = pareto_front(db.trials(row.id), OBJECTIVES)
    medians = {front[-1].number: 0.99, front[-2].number: 0.995, front[0].number: 0.5}
    db.apply(
        TrialWrite("update", row.id, n, {"remeasured": {"metric": "score", "values": [m], "median": m}})
        for n, m in medians.items()
    )
    return row.id


@pytest.fixture(scope="module")
def big_study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StudyDB, int]]:
    db = StudyDB(f"sqlite:///{tmp_path_factory.mktemp('export') / 'study.db'}")
    db.create_tables()
    yield db, _write_study(db)
    db.dispose()


def _entry(trial: Any) -> dict[str, Any]:
    return {"trial": trial.number, "params": trial.params, "metrics": trial.metrics}


def test_the_export_equals_the_full_scan_of_every_trial(big_study: tuple[StudyDB, int]) -> None:
    db, study_id = big_study
    row = db.get_study(study_id)
    trials = db.trials(study_id)
    assert len(trials) == N_TRIALS
    front, best = pareto_front(trials, OBJECTIVES), best_trial(trials, OBJECTIVES)
    assert best is not None and best.remeasured and best.number != front[0].number  # the medians decide

    whole = export_document(db, row, limit=None)
    assert whole["pareto_front"] == [_entry(t) for t in front]
    assert whole["pareto_front_total"] == len(front) > 10
    assert (whole["trial"], whole["params"], whole["metrics"]) == (best.number, best.params, best.metrics)
    assert whole["on_pareto_front"] and whole["fingerprint"] == best.fingerprint

    capped = export_document(db, row, limit=10)
    assert capped["pareto_front"] == whole["pareto_front"][:10] and capped["pareto_front_limit"] == 10
    assert capped["pareto_front_total"] == len(front) and capped["trial"] == best.number

    off_front = next(t for t in trials if t.status == "ok" and t.feasible and t not in front)
    chosen = export_document(db, row, off_front.number, limit=0)
    assert chosen["trial"] == off_front.number and not chosen["on_pareto_front"] and chosen["pareto_front"] == []
    assert chosen["metrics"] == off_front.metrics

    # The registry publishes the same pick.
    assert _winner(db, row, None).number == best.number


class Statements:
    """Every SQL statement run on an engine while recording, with its parameters."""

    def __init__(self, db: StudyDB) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.engine = db.engine

    def _record(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        self.seen.append((statement, parameters))

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)

    def trial_reads(self) -> list[tuple[str, Any]]:
        return [(s, p) for s, p in self.seen if re.search(r"\bFROM tuner_trials\b", s)]


def _by_number(statement: str) -> bool:
    """Whether a read of the trial table selects rows by their number (not every row of the study)."""
    return re.search(r"tuner_trials\.number (IN|=)", statement) is not None


def test_the_export_reads_a_bounded_number_of_rows(big_study: tuple[StudyDB, int]) -> None:
    db, study_id = big_study
    row = db.get_study(study_id)
    with Statements(db) as old:  # what the full scan ran: one read of every trial, not by number
        pareto_front(db.trials(study_id), OBJECTIVES)
    assert [s for s, _ in old.trial_reads() if not _by_number(s)]

    with Statements(db) as new:
        document = export_document(db, row, limit=20)
    assert len(document["pareto_front"]) == 20
    assert len(new.seen) <= 6
    reads = new.trial_reads()
    assert reads and all(_by_number(s) for s, _ in reads)
    bound_numbers = sum(len(p) if isinstance(p, (tuple, list, dict)) else 1 for _, p in reads)
    assert bound_numbers <= 2 * (20 + 1) + 2 * len(reads)  # the page's numbers and the pick's, with the study id
    assert not re.search(r"\bFROM tuner_trial_values\b", " ".join(s for s, _ in new.seen))
