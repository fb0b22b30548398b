"""Property-based API tests generated from the OpenAPI schema: no 5xx, no response that breaks the schema."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from api.main import create_app
from api.settings import Settings
from tuner.store.storage import StudyDB

TOKEN = "schema-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DB_URL = f"sqlite:///{Path(tempfile.mkdtemp()) / 'schemathesis.db'}"


def _seed(db: StudyDB) -> None:
    """A finished study with trials, so that reads of study 1 and its trials have something to return."""
    row = db.create_study(
        name="seeded",
        workload="noop",
        status="completed",
        space={"params": {}},
        space_hash="0",
        spec={
            "name": "seeded",
            "workload": "noop",
            "objectives": [{"metric": "score"}, {"metric": "cost"}],
            "budget": {"trials": 3},
        },
    )
    for number, (score, status) in enumerate([(0.9, "ok"), (0.5, "ok"), (None, "timeout")]):
        db.insert_trial(
            row.id, number, {"x": 0.1 * number, "tile": 64, "stages": 3, "mode": "fast"}, optuna_trial_id=None
        )
        metrics = {"score": score, "cost": 1.0 + number} if score is not None else {}
        db.finish_trial(
            row.id,
            number,
            status=status,
            metrics=metrics,
            samples_ms=[1.0],
            feasible=status == "ok",
            timing_comparable=False,
            error=None if status == "ok" else "no result",
            worker="w0.0",
            attempt=1,
            fingerprint={"python": "3"},
        )


app = create_app(Settings(db_url=DB_URL, token=TOKEN))
_seed(app.state.db)
# The event stream of a study that never ends (schemathesis queues studies no orchestrator runs) never
# closes: it is tested in test_api.py on a finished study instead.
schema = schemathesis.openapi.from_asgi("/openapi.json", app).exclude(path_regex=r"/events$")


@pytest.mark.timeout(600)
@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers=AUTH,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
    )
