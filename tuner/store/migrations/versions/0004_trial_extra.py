"""What a workload reports beside its metrics (``TrialResult.extra``: the timing summary with its 95%
interval and convergence, loss curves, memory facts), kept with the trial (NULL for earlier trials).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tuner_trials", sa.Column("extra", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials") as batch:
        batch.drop_column("extra")
