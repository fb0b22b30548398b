"""Reads of a 100,000-trial study without a pass over it.

- The front's trial numbers in front order beside the front (``tuner_study_summaries.front_order``), so that
  a page of the front, its size and a sample of it are one short column (a list of integers) instead of the
  whole front decoded and sorted on every read. NULL in summaries written before this revision: their next
  write sets it, and reads sort the front meanwhile.
- ``(study_id, status, number)`` instead of ``(study_id, status)``: a page filtered by status walks it in
  number order and stops at the page.
- A partial index of the failures (``storage.FAILED_SQL``): the failure panel reads the latest failures of a
  study of mostly good trials without reading the good ones.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


#: As ``tuner.store.storage.FAILED_SQL`` when this revision was written (a migration does not follow later code).
FAILED_SQL = "duplicate_of IS NULL AND (status NOT IN ('ok', 'running') OR (status = 'ok' AND feasible = false))"


def upgrade() -> None:
    op.add_column("tuner_study_summaries", sa.Column("front_order", sa.JSON(), nullable=True))
    op.drop_index("ix_tuner_trials_study_status", "tuner_trials")
    op.create_index("ix_tuner_trials_study_status", "tuner_trials", ["study_id", "status", "number"])
    where = sa.text(FAILED_SQL)
    op.create_index(
        "ix_tuner_trials_failures",
        "tuner_trials",
        ["study_id", "number"],
        sqlite_where=where,
        postgresql_where=where,
    )


def downgrade() -> None:
    op.drop_index("ix_tuner_trials_failures", "tuner_trials")
    op.drop_index("ix_tuner_trials_study_status", "tuner_trials")
    op.create_index("ix_tuner_trials_study_status", "tuner_trials", ["study_id", "status"])
    with op.batch_alter_table("tuner_study_summaries") as batch:
        batch.drop_column("front_order")
