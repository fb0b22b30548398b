"""The changed trials of a study as its event streams send them, read once for all of its streams.

Every open page of a running study holds an event stream that looks for changed trials every second. Read
by each stream, fifty pages cost fifty reads and fifty serialisations of the same trials a second. The
feed here keeps, per study, the latest changes (each trial once, at its last change, as
``queries.changes_since`` answers it), serialised once; a stream whose position the feed covers takes its
changes from it, and the feed reads the database only when the study's sequence moved past it. A stream
from further back than the feed reaches (a reconnect after a long gap) reads the database itself.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

from api.views import trial_out
from tuner.store import queries

#: Changes a feed keeps per study (older ones are read from the database by the streams that need them).
FEED_KEEP = 2000


@dataclass
class _Feed:
    floor: int  # every change after this seq is in ``items``
    upto: int  # the feed has read the changes up to this seq
    items: list[tuple[int, int, str]] = field(default_factory=list)  # (seq, trial number, trial JSON)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


#: database -> study id -> its feed
_FEEDS: weakref.WeakKeyDictionary[Any, dict[int, _Feed]] = weakref.WeakKeyDictionary()


def _serialised(rows: list[Any]) -> list[tuple[int, int, str]]:
    return [(int(t.seq or 0), t.number, trial_out(t).model_dump_json()) for t in rows]


async def changes(db: Any, study_id: int, seq: int, latest: int, limit: int) -> list[tuple[int, str]]:
    """The trials changed after ``seq`` (the study's sequence is at ``latest``), oldest change first, at most
    ``limit``: (seq of the change, the trial as ``/trials`` lists it, as JSON)."""
    feeds = _FEEDS.setdefault(db, {})
    feed = feeds.get(study_id)
    if feed is None or seq < feed.floor:
        if feed is None:
            feeds[study_id] = _Feed(floor=seq, upto=seq)
        rows = await asyncio.to_thread(queries.changes_since, db, study_id, seq, limit)
        return [(s, body) for s, _, body in _serialised(rows)]
    async with feed.lock:  # one read for every stream waiting on it
        if seq > feed.upto:  # the feed lags behind this stream (no stream read it for a while): start anew
            feed.floor = feed.upto = seq
            feed.items = []
        for _ in range(4):  # a few pages at most; a stream asks again for the rest
            if feed.upto >= latest:
                break
            rows = await asyncio.to_thread(queries.changes_since, db, study_id, feed.upto, limit)
            if not rows:
                break
            _add(feed, _serialised(rows))
    return [(s, body) for s, _, body in feed.items if s > seq][:limit]


def _add(feed: _Feed, fresh: list[tuple[int, int, str]]) -> None:
    """Fold newly read changes into the feed: a trial changed again leaves its older entry."""
    numbers = {number for _, number, _ in fresh}
    feed.items = [item for item in feed.items if item[1] not in numbers] + fresh
    feed.upto = max(feed.upto, fresh[-1][0])
    if len(feed.items) > FEED_KEEP:
        dropped = feed.items[: len(feed.items) - FEED_KEEP]
        feed.items = feed.items[len(dropped) :]
        feed.floor = max(feed.floor, dropped[-1][0])
