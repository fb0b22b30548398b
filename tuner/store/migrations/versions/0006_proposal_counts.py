"""Proposals the sampler replaced inside its proposal step, per study (``{"repeats_replaced": n,
"static_rejected": m}``): counted on the study, not written as trial rows (NULL for studies whose
sampler replaces nothing, and for earlier studies).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tuner_studies", sa.Column("proposal_counts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("proposal_counts")
