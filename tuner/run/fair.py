"""Fair shares of a runner's worker slots between the studies it runs at once.

A runner runs up to ``max_studies`` studies, each with its own orchestrator (in its own thread) and
its own worker actors. The slots they share are keyed by the device a worker runs on: one key per
GPU (the Ray GPU ids of the worker), or, on a CPU, one key per worker index (the runner's CPU
slots). A study may queue trials on a key only while it holds it; a key is held by one study at a
time, so one GPU times one study's trials at a time, in its worker's dispatch order (one timing
trial per GPU, as with one study).

Who gets a key when several studies want it: the study with the fewest trials granted so far for
its weight (``priority`` in the spec; default 1), so equal studies take turns trial by trial and a
study of priority 3 gets three trials for every one of a study of priority 1. A study that joins
starts at the current lowest share, so a newcomer neither waits for a long study nor takes every
slot until it has caught up with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

WANT_TTL_S = 2.0  # a study that asked for a key counts as wanting it this long (it asks again every poll)
SHARED_POLL_S = 0.05  # how often a study sharing the slots looks for results (a given-back key is taken soon)


class SlotBroker:
    """Thread-safe; every study's orchestrator calls it from its own thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._weight: dict[int, float] = {}
        self._served: dict[int, float] = {}  # trials granted / weight
        self._holder: dict[Hashable, tuple[int, int]] = {}  # key -> (study, trials queued under it)
        self._wants: dict[Hashable, dict[int, float]] = {}  # key -> {study: when it last asked for it}

    def join(self, study: int, weight: float = 1.0) -> None:
        with self._cond:
            self._weight[study] = float(weight)
            self._served[study] = min(self._served.values(), default=0.0)

    def leave(self, study: int) -> None:
        with self._cond:
            self._weight.pop(study, None)
            self._served.pop(study, None)
            for key in [k for k, (s, _) in self._holder.items() if s == study]:
                del self._holder[key]
            for wants in self._wants.values():
                wants.pop(study, None)
            self._cond.notify_all()

    def take(self, study: int, key: Hashable) -> bool:
        """One trial's slot on ``key`` for ``study``, or False (the study is noted as wanting it either way)."""
        with self._cond:
            holder = self._holder.get(key)
            now = time.monotonic()
            wants = self._wants.setdefault(key, {})
            rivals = [s for s, t in wants.items() if s != study and s in self._served and now - t < WANT_TTL_S]
            if now - wants.get(study, -WANT_TTL_S) >= WANT_TTL_S and rivals:
                # back after a pause: from the others' share on, not with a credit for the time away
                self._served[study] = max(self._served[study], min(self._served[s] for s in rivals))
            wants[study] = now
            if holder is not None and holder[0] != study:
                return False
            mine = self._served[study]
            if rivals and min(self._served[s] for s in rivals) < mine:
                return False  # a study further behind wants this key: let it drain to that one
            self._holder[key] = (study, (holder[1] if holder else 0) + 1)
            self._served[study] = mine + 1.0 / self._weight[study]
            return True

    def settle(self, study: int, queued: dict[Hashable, int]) -> None:
        """The trials ``study`` has queued under each key now: keys it no longer uses go back."""
        with self._cond:
            for key, (holder, _) in list(self._holder.items()):
                if holder != study:
                    continue
                if queued.get(key, 0) > 0:
                    self._holder[key] = (study, queued[key])
                else:
                    del self._holder[key]
                    self._cond.notify_all()

    def poll_s(self, alone_s: float) -> float:
        """How long a study waits for results at a time: ``alone_s``, or briefly while others share the slots."""
        with self._cond:
            return alone_s if len(self._weight) <= 1 else min(alone_s, SHARED_POLL_S)

    def wait(self, timeout_s: float) -> None:
        """Sleep until a key is given back (or ``timeout_s``): for a study refused with nothing in flight."""
        with self._cond:
            self._cond.wait(timeout_s)

    def held(self, study: int) -> dict[Hashable, int]:
        with self._cond:
            return {k: n for k, (s, n) in self._holder.items() if s == study}
