"""Reads in SQL: the objectives stored with each study, a change sequence on trials, indexes by study and
status or sequence, the sortable metric values and the per-study summary (``tuner/store/summary.py``).

Studies stored before this revision get their summary and metric values on the next start of a writer
(``StudyDB.backfill_summaries``, run by ``create_tables`` after the migrations), and their objectives at
their next trial write (or stay without, shown with an error, when their workload no longer builds).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def _study_fk() -> sa.ForeignKey:
    return sa.ForeignKey("tuner_studies.id", ondelete="CASCADE")


def upgrade() -> None:
    op.add_column("tuner_studies", sa.Column("objectives", sa.JSON, nullable=True))
    op.add_column("tuner_trials", sa.Column("seq", sa.Integer, nullable=True))
    op.create_index("ix_tuner_trials_study_status", "tuner_trials", ["study_id", "status"])
    op.create_index("ix_tuner_trials_study_seq", "tuner_trials", ["study_id", "seq"])
    op.create_table(
        "tuner_trial_values",
        sa.Column("study_id", sa.Integer, _study_fk(), primary_key=True),
        sa.Column("number", sa.Integer, primary_key=True),
        sa.Column("metric", sa.String(128), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
    )
    op.create_index("ix_tuner_trial_values_order", "tuner_trial_values", ["study_id", "metric", "value", "number"])
    op.create_index(
        "ix_tuner_trial_values_status_order",
        "tuner_trial_values",
        ["study_id", "metric", "status", "value", "number"],
    )
    op.create_table(
        "tuner_study_summaries",
        sa.Column("study_id", sa.Integer, _study_fk(), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("n_trials", sa.Integer, nullable=False),
        sa.Column("counts", sa.JSON, nullable=False),
        sa.Column("front", sa.JSON, nullable=False),
        sa.Column("front_size", sa.Integer, nullable=False),
        sa.Column("remeasured", sa.JSON, nullable=False),
        sa.Column("best", sa.JSON, nullable=True),
        sa.Column("updated_at", TZ, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tuner_study_summaries")
    op.drop_table("tuner_trial_values")
    op.drop_index("ix_tuner_trials_study_seq", "tuner_trials")
    op.drop_index("ix_tuner_trials_study_status", "tuner_trials")
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("seq")
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("objectives")
