"""``GET /api/studies/{id}/events``: a study's server-sent event stream, what the study page listens to while
the study runs. Each stream looks at the study once a second: its changed trials come from the study's shared
feed (:mod:`api.event_feed`), the study itself from a snapshot every stream of it shares, so fifty open pages
of a study cost about one read of it. A database blip is waited out inside the stream (the response has
started: it cannot become a 503); a silent stream sends a keep-alive comment every ``EVENT_KEEPALIVE_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from api import event_feed
from api.deps import MAX_ID, DBDep, StudyDep, require_read
from api.routes.studies import ERRORS
from api.views import view_out
from tuner.store import lifecycle, queries
from tuner.store.storage import is_transient

log = logging.getLogger("api")
TERMINAL = lifecycle.TERMINAL

router = APIRouter(prefix="/api/studies", tags=["studies"], dependencies=[Depends(require_read)])


@router.get(
    "/{study_id}/events",
    response_class=StreamingResponse,
    responses={200: {"description": "server-sent events", "content": {"text/event-stream": {}}}, **ERRORS},
)
async def study_events(
    row: StudyDep,
    db: DBDep,
    request: Request,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> StreamingResponse:
    """Server-sent events of what changed since the client's last event, until the study reaches a terminal
    status: ``event: trials`` with ``{"seq", "trials": [...]}`` (each trial as in ``/trials``, at most 500 an
    event), then ``event: study`` (as an item of ``GET /api/studies``) whenever it changed; every event's
    ``id`` is the change sequence it brings the client to. The start is the ``Last-Event-ID`` header (an
    ``EventSource`` reconnecting), else ``?after=`` (e.g. the ``seq`` of ``/overview``), else now."""
    start = after
    if last_event_id is not None and last_event_id.strip().isdigit():
        start = int(last_event_id.strip())
    return StreamingResponse(
        _event_stream(db, row.id, request, start), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _event_stream(db: Any, study_id: int, request: Request, seq: int | None) -> Any:
    last, waiting = None, False
    said = time.monotonic()  # when the stream last sent anything
    while not await request.is_disconnected():
        try:
            if seq is None:
                seq = await asyncio.to_thread(queries.last_seq, db, study_id)
            messages, seq, last, state = await _look(db, study_id, seq, last)
        except (DBAPIError, PoolTimeout) as exc:
            # A database blip: the response has started, so it cannot become a 503; the stream waits
            # the blip out (with comments, which keep proxies from closing it) and goes on from ``seq``.
            if not is_transient(exc):
                raise
            if not waiting:
                log.warning(
                    "event stream of study %s: database unreachable (%s); retrying", study_id, type(exc).__name__
                )
            waiting, said = True, time.monotonic()
            yield ": the study database cannot be reached; retrying\n\n"
            await asyncio.sleep(EVENT_POLL_S)
            continue
        waiting = False
        for message in messages:
            said = time.monotonic()
            yield message
        if state == "done":
            return
        if state == "more":
            continue  # more to catch up on: no pause
        # In seconds, not in looks: a look takes longer on a loaded server, and a client or proxy with a
        # read timeout drops a stream that stays silent too long.
        if time.monotonic() - said >= EVENT_KEEPALIVE_S:
            said = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(EVENT_POLL_S)


async def _look(db: Any, study_id: int, seq: int, last: str | None) -> tuple[list[str], int, str | None, str]:
    """One look at the study for its event stream: (messages to send, the new ``seq``, the new last study
    payload, state): ``done`` (deleted or terminal), ``more`` (a full batch of trials: look again at
    once), ``changed`` (the study's payload changed) or ``idle``. The study itself comes from the snapshot
    every stream of it shares; its changed trials are read only when there are some past ``seq``."""
    snapshot = await _snapshot(db, study_id)
    if snapshot is None:
        return ["event: deleted\ndata: {}\n\n"], seq, last, "done"
    current, payload, latest = snapshot
    messages = []
    changed = await event_feed.changes(db, study_id, seq, latest, EVENT_TRIALS) if latest > seq else []
    if changed:
        seq = max(s for s, _ in changed)
        body = f'{{"seq": {seq}, "trials": [{", ".join(trial for _, trial in changed)}]}}'
        messages.append(f"id: {seq}\nevent: trials\ndata: {body}\n\n")
        if len(changed) == EVENT_TRIALS:
            return messages, seq, last, "more"
    if payload == last:
        return messages, seq, last, "changed" if changed else "idle"
    messages.append(f"id: {seq}\nevent: study\ndata: {payload}\n\n")
    return messages, seq, payload, "done" if current.status in TERMINAL else "changed"


#: database -> study id -> (monotonic time read, (row, ``event: study`` payload, last change seq) or None)
_SNAPSHOTS: weakref.WeakKeyDictionary[Any, dict[int, tuple[float, Any]]] = weakref.WeakKeyDictionary()


async def _snapshot(db: Any, study_id: int) -> tuple[Any, str, int] | None:
    """The study as every open event stream of it sends it, read at most once per ``EVENT_POLL_S / 2``
    whatever the number of streams: fifty open pages of a study cost one read of it, not fifty."""
    now = time.monotonic()
    snapshots = _SNAPSHOTS.setdefault(db, {})
    cached = snapshots.get(study_id)
    if cached is not None and now - cached[0] < EVENT_POLL_S / 2:
        return cached[1]

    def read() -> tuple[Any, str, int] | None:
        current = lifecycle.visible(db.get_study(study_id))
        if current is None:
            return None
        view = queries.study_view(db, current)
        # With the database: the ETA from the recent trial rate, the ``eta_s`` that GET /api/studies/{id} answers.
        return current, view_out(view, db=db).model_dump_json(), int(view.summary.seq)

    snapshot = await asyncio.to_thread(read)
    if len(snapshots) > 1000:  # streams of studies long gone
        snapshots.clear()
    snapshots[study_id] = (time.monotonic(), snapshot)
    return snapshot


#: Trials an ``event: trials`` carries at most; how often a stream looks for changes; the longest a
#: stream stays silent (a keep-alive comment then).
EVENT_TRIALS = 500
EVENT_POLL_S = 1.0
EVENT_KEEPALIVE_S = 15.0
