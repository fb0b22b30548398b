"""Baseline: the study tables of release 0.1.0.

An empty database gets the tables. A database that release (or an earlier one) made has them,
perhaps without the columns added later (leases, idempotency keys, repeat detection); this revision
adds what is missing, as 0.1.0's start-up did: nullable, rows already there given the default, a
unique column as a unique index. Nothing stored is rewritten or dropped.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def _studies() -> list[sa.Column]:
    return [
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("workload", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("space", sa.JSON, nullable=False),
        sa.Column("space_hash", sa.String(64), nullable=False),
        sa.Column("optuna_name", sa.String(160), nullable=False),
        sa.Column("device", sa.JSON, nullable=True),
        sa.Column("fingerprint", sa.JSON, nullable=True),
        sa.Column("elapsed_s", sa.Float, nullable=False),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", TZ, nullable=True),
        sa.Column("stop_requested", sa.Boolean, nullable=False, info={"default": False}),
        sa.Column("idempotency_key", sa.String(200), nullable=True, unique=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    ]


def _trials() -> list[Any]:
    return [
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tuner_studies.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("optuna_trial_id", sa.Integer, nullable=True),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("samples_ms", sa.JSON, nullable=False),
        sa.Column("feasible", sa.Boolean, nullable=True),
        sa.Column("timing_comparable", sa.Boolean, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False, info={"default": 1}),
        sa.Column("duplicate_of", sa.Integer, nullable=True),
        sa.Column("remeasured", sa.JSON, nullable=True),
        sa.Column("fingerprint", sa.JSON, nullable=True),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("finished_at", TZ, nullable=True),
    ]


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("tuner_studies"):
        op.create_table("tuner_studies", *_studies())
        op.create_index("ix_tuner_studies_name", "tuner_studies", ["name"], unique=True)
    else:
        _add_missing("tuner_studies", _studies(), inspector)
    if not inspector.has_table("tuner_trials"):
        op.create_table(
            "tuner_trials", *_trials(), sa.UniqueConstraint("study_id", "number", name="uq_tuner_trial_number")
        )
        op.create_index("ix_tuner_trials_study_id", "tuner_trials", ["study_id"])
        op.create_index("ix_tuner_trials_status", "tuner_trials", ["status"])
    else:
        _add_missing("tuner_trials", _trials(), inspector)


def _add_missing(table: str, columns: list[sa.Column], inspector: Any) -> None:
    present = {c["name"] for c in inspector.get_columns(table)}
    for column in columns:
        if column.name in present:
            continue
        op.add_column(table, sa.Column(column.name, column.type, nullable=True))
        if column.unique:
            op.create_index(f"uq_{table}_{column.name}", table, [column.name], unique=True)
        if "default" in column.info:
            op.execute(
                sa.table(table, sa.column(column.name, column.type))
                .update()
                .values({column.name: column.info["default"]})
            )


def downgrade() -> None:
    op.drop_table("tuner_trials")
    op.drop_table("tuner_studies")
