"""The best-config registry (``tuner/best_configs/registry.py``): one entry per (workload, shape, fixed args, GPU,
software),
and where a warm-started trial's config came from.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tuner_configs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("workload", sa.String(64), nullable=False),
        sa.Column("shape", sa.JSON, nullable=False),
        sa.Column("shape_key", sa.String(512), nullable=False),
        sa.Column("fixed", sa.JSON, nullable=False),
        sa.Column("fixed_key", sa.String(1024), nullable=False),
        sa.Column("gpu", sa.String(128), nullable=False),
        sa.Column("fingerprint", sa.JSON, nullable=False),
        sa.Column("software_key", sa.String(64), nullable=False),
        sa.Column("comparable", sa.Boolean, nullable=False),
        sa.Column("args", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("exported", sa.JSON, nullable=False),
        sa.Column("objective", sa.String(128), nullable=False),
        sa.Column("direction", sa.String(16), nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("interval", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("recheck", sa.JSON, nullable=True),
        sa.Column("study_id", sa.Integer, nullable=True),
        sa.Column("study_name", sa.String(128), nullable=True),
        sa.Column("trial_number", sa.Integer, nullable=True),
        sa.Column("measured_at", TZ, nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.UniqueConstraint("workload", "shape_key", "fixed_key", "gpu", "software_key", name="uq_tuner_configs_key"),
    )
    op.create_index("ix_tuner_configs_lookup", "tuner_configs", ["workload", "gpu", "comparable"])
    op.create_index("ix_tuner_configs_status", "tuner_configs", ["status"])
    op.create_table(
        "tuner_trial_origins",
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tuner_studies.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("number", sa.Integer, primary_key=True),
        sa.Column("origin", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tuner_trial_origins")
    op.drop_index("ix_tuner_configs_status", "tuner_configs")
    op.drop_index("ix_tuner_configs_lookup", "tuner_configs")
    op.drop_table("tuner_configs")
