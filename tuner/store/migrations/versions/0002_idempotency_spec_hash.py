"""The spec hash beside the idempotency key, so a retried submit is compared in the transaction that
made the study (a NULL hash: a study submitted before; its stored spec is compared instead).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tuner_studies", sa.Column("idempotency_spec_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("idempotency_spec_hash")
