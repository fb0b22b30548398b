"""Notes: ``PUT /api/studies/{id}/note`` and ``PUT /api/studies/{id}/trials/{number}/note`` (body ``{"text": ...}``,
markdown, at most ``MAX_NOTE_CHARS``; an empty text removes the note), written with the API token. They come
back in the study's and the trial's JSON and in the study's export (``notes``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path
from pydantic import BaseModel, Field

from api.deps import MAX_ID, DBDep, StudyDep, require_read, require_write
from api.routes.studies import ERRORS
from api.schemas import ErrorOut
from tuner.store import notes
from tuner.store.schema import MAX_NOTE_CHARS

router = APIRouter(prefix="/api/studies", tags=["notes"], dependencies=[Depends(require_read), Depends(require_write)])


class NoteIn(BaseModel):
    text: str = Field(max_length=MAX_NOTE_CHARS, description="markdown; empty removes the note")


class NoteOut(BaseModel):
    study_id: int
    trial: int | None
    text: str | None


BODY_ERRORS = {**ERRORS, 400: {"model": ErrorOut, "description": "the body is not JSON"}}


@router.put("/{study_id}/note", response_model=NoteOut, responses=BODY_ERRORS)
def put_study_note(row: StudyDep, db: DBDep, body: NoteIn) -> NoteOut:
    """Write the study's note."""
    notes.set_note(db, row.id, None, body.text)
    return NoteOut(study_id=row.id, trial=None, text=notes.note(db, row.id))


@router.put("/{study_id}/trials/{number}/note", response_model=NoteOut, responses=BODY_ERRORS)
def put_trial_note(row: StudyDep, db: DBDep, number: Annotated[int, Path(ge=0, le=MAX_ID)], body: NoteIn) -> NoteOut:
    """Write one trial's note (the trial must exist)."""
    if db.trial(row.id, number) is None:
        raise HTTPException(404, f"study {row.id} has no trial {number}")
    notes.set_note(db, row.id, number, body.text)
    return NoteOut(study_id=row.id, trial=number, text=notes.note(db, row.id, number))
