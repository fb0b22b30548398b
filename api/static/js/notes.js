/* Notes on the study page: the study's markdown note and one trial's (the selected one by default), shown as
 * text and edited in place. Saving is a PUT with the API token where the server needs one: the token box of
 * the page's controls, else the tab's stored token, else the page asks for it. */
import { $ } from "./dom.js";
import { authHeaders, getJSON, ROOT, storedToken } from "./api.js";
import { base } from "./state.js";

const shown = { study: null, trial: null };

function token() {
  const box = $("api-token");
  return (box && box.value.trim()) || storedToken();
}

/** PUT ``text`` as the note at ``path``; asks for the token once if the server refuses without one. */
async function putNote(path, text) {
  const send = (value) =>
    fetch(ROOT + path, {
      method: "PUT",
      headers: Object.assign(authHeaders({ "content-type": "application/json" }), value ? { Authorization: `Bearer ${value}` } : {}),
      body: JSON.stringify({ text }),
    });
  let response = await send(token());
  if (response.status === 401) {
    const typed = window.prompt("This server needs its API token (TUNER_API_TOKEN) to write notes:");
    if (!typed) return { ok: false, detail: "not saved: no token" };
    const box = $("api-token");
    if (box) box.value = typed;
    response = await send(typed.trim());
  }
  let detail = "";
  try {
    const body = await response.json();
    detail = response.ok ? "" : JSON.stringify(body.detail);
  } catch (_) {
    /* no body */
  }
  return { ok: response.ok, detail: response.ok ? "saved" : `not saved (${response.status}) ${detail}` };
}

/** Show the study's note (from the study's JSON), unless it is being edited. */
export function renderStudyNote(study) {
  const text = (study && study.note) || "";
  if (shown.study === text || document.activeElement === $("study-note-text")) return;
  shown.study = text;
  $("study-note-view").textContent = text || "No note yet.";
  $("study-note-text").value = text;
}

/** Load and show the note of trial ``number`` (the selected trial). */
export async function showTrialNote(number) {
  if (number === null || number === undefined || !$("trial-note-number")) return;
  $("trial-note-number").value = String(number);
  try {
    const trial = await getJSON(`${base}/trials/${number}`);
    shown.trial = trial.note || "";
  } catch (_) {
    shown.trial = "";
  }
  $("trial-note-view").textContent = shown.trial || `Trial ${number} has no note.`;
  $("trial-note-text").value = shown.trial;
}

async function saveStudyNote() {
  const text = $("study-note-text").value;
  const answer = await putNote(`${base}/note`, text);
  $("study-note-result").textContent = answer.detail;
  if (answer.ok) {
    shown.study = text;
    $("study-note-view").textContent = text || "No note yet.";
  }
}

async function saveTrialNote() {
  const number = Number($("trial-note-number").value);
  if (!Number.isInteger(number) || number < 0) {
    $("trial-note-result").textContent = "choose a trial number";
    return;
  }
  const answer = await putNote(`${base}/trials/${number}/note`, $("trial-note-text").value);
  $("trial-note-result").textContent = answer.detail;
  if (answer.ok) await showTrialNote(number);
}

export function bindNotes() {
  if (!$("notes-card")) return;
  $("study-note-save").addEventListener("click", saveStudyNote);
  $("trial-note-save").addEventListener("click", saveTrialNote);
  $("trial-note-number").addEventListener("change", () => showTrialNote(Number($("trial-note-number").value)));
}
