"""Notes on a study and on its trials (``tuner_notes``): one markdown text each, empty text removing it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select

from tuner.store.schema import STUDY_NOTE, NoteRow
from tuner.store.storage import StudyDB


def set_note(db: StudyDB, study_id: int, number: int | None, text: str) -> None:
    """Write the note of the study (``number`` None) or of its trial ``number``; an empty text deletes it."""
    key = STUDY_NOTE if number is None else number
    with db.Session.begin() as s:
        s.execute(delete(NoteRow).where(NoteRow.study_id == study_id, NoteRow.number == key))
        if text.strip():
            s.add(NoteRow(study_id=study_id, number=key, text=text))


def note(db: StudyDB, study_id: int, number: int | None = None) -> str | None:
    """The note of the study (``number`` None) or of one trial, or None."""
    key = STUDY_NOTE if number is None else number
    with db.Session() as s:
        return s.scalar(select(NoteRow.text).where(NoteRow.study_id == study_id, NoteRow.number == key))


def study_notes(db: StudyDB, study_id: int) -> dict[str, Any]:
    """Every note of a study: ``{"study": text or None, "trials": {"number": text}}``, trials by number."""
    with db.Session() as s:
        found = s.execute(
            select(NoteRow.number, NoteRow.text).where(NoteRow.study_id == study_id).order_by(NoteRow.number)
        ).all()
    texts = dict(found)
    return {"study": texts.pop(STUDY_NOTE, None), "trials": {str(n): t for n, t in texts.items()}}
