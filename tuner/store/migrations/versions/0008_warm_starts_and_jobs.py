"""How each study started (``tuner/best_configs/warm_start.py``: the warm start chosen and why, the registry configs it
enqueued, the priors its strategy read) and the runner's scheduled jobs (``tuner/run/jobs.py``: the recheck's
last run and what it found).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tuner_warm_starts",
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("decision", sa.JSON, nullable=False),
        sa.Column("configs", sa.JSON, nullable=False),
        sa.Column("priors", sa.JSON, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "tuner_jobs",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("every_s", sa.Float, nullable=True),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("finished_at", TZ, nullable=True),
        sa.Column("owner", sa.String(256), nullable=True),
        sa.Column("result", sa.JSON, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("tuner_jobs")
    op.drop_table("tuner_warm_starts")
