"""Where the kernels run: the environment checks they need, with the standard library only."""

from __future__ import annotations

import os


def interpreter_active() -> bool:
    """Whether Triton runs kernels under its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
