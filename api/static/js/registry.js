/* gpu-knob-tuner: the best-config registry page, and the warm-start origins on a study page.
 *
 * Same safety rule as the dashboard's other modules (dom.js): every string from the API reaches the DOM through
 * textContent or attributes, never as markup. Reads send the tab's API token when one was entered (api.js).
 */

import { $ } from "./dom.js";
import { ROOT, authHeaders, getJSON, setUpAuthForm } from "./api.js";

const POLL_MS = 5000;

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fmt(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(4);
  return String(value);
}

function pairs(object) {
  return Object.entries(object || {})
    .map(([k, v]) => `${k}=${typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v)}`)
    .join(" ");
}

function interval(iv) {
  return iv ? `[${fmt(iv.low)}, ${fmt(iv.high)}]` : "";
}

// ---------------------------------------------------------------- registry page
function registryQuery() {
  const params = new URLSearchParams({ limit: "200" });
  for (const [id, name] of [
    ["registry-workload", "workload"],
    ["registry-gpu", "gpu"],
    ["registry-status", "status"],
  ]) {
    const value = $(id).value.trim();
    if (value) params.set(name, value);
  }
  // "m=4096 n=4096": shape values the entries must have
  for (const item of $("registry-shape").value.trim().split(/[\s,]+/)) {
    const [name, value] = item.split("=");
    if (name && value !== undefined && !["workload", "gpu", "status", "limit", "offset"].includes(name)) {
      params.set(name, value);
    }
  }
  return params;
}

function entryRow(entry) {
  const tr = document.createElement("tr");
  tr.dataset.entryId = String(entry.id);
  tr.dataset.status = entry.status;
  tr.className = `entry-${entry.status}`;
  tr.appendChild(cell(String(entry.id)));
  tr.appendChild(cell(entry.workload));
  tr.appendChild(cell(pairs(entry.shape)));
  tr.appendChild(cell(pairs(entry.fixed)));
  tr.appendChild(cell(entry.comparable ? entry.gpu : `${entry.gpu} (not comparable)`));
  const status = cell("");
  const badge = document.createElement("span");
  badge.className = `badge entry-status entry-status-${entry.status}`;
  badge.textContent = entry.status;
  status.appendChild(badge);
  tr.appendChild(status);
  tr.appendChild(cell(`${entry.objective} ${fmt(entry.value)} ${interval(entry.interval)}`));
  const recheck = entry.recheck;
  tr.appendChild(
    cell(recheck ? `${recheck.verdict}: now ${interval(recheck.interval)}, was ${interval(recheck.previous)}` : "-"),
  );
  const from = cell("");
  if (entry.study_id) {
    const link = document.createElement("a");
    link.href = `${ROOT}/studies/${entry.study_id}#trial-${entry.trial}`;
    link.textContent = `${entry.study || "study " + entry.study_id} · trial ${entry.trial}`;
    from.appendChild(link);
  } else {
    from.textContent = entry.study || "-";
  }
  tr.appendChild(from);
  tr.appendChild(cell(pairs(entry.config), "mono small"));
  tr.appendChild(cell(entry.measured_at ? entry.measured_at.replace("T", " ").slice(0, 19) : "-"));
  const action = cell("");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "retune";
  button.textContent = "Re-tune";
  button.title = "Queue a study of this shape again, warm-started from the registry";
  button.addEventListener("click", () => retune(entry.id));
  action.appendChild(button);
  tr.appendChild(action);
  return tr;
}

async function retune(entryId) {
  const typed = $("registry-token").value.trim();
  const auth = typed ? { Authorization: `Bearer ${typed}` } : {};
  const result = $("retune-result");
  const response = await fetch(`${ROOT}/api/configs/${entryId}/retune`, {
    method: "POST",
    headers: Object.assign(authHeaders({ accept: "application/json" }), auth),
  });
  let body = {};
  try {
    body = await response.json();
  } catch (_) {
    /* not JSON */
  }
  if (!response.ok) {
    result.textContent = response.status === 401 ? "Enter the API token to queue a re-tune." : `Re-tune refused: ${response.status} ${typeof body.detail === "string" ? body.detail : ""}`;
    return;
  }
  result.textContent = "Queued ";
  const link = document.createElement("a");
  link.id = "retune-link";
  link.href = ROOT + body.dashboard_url;
  link.textContent = body.name;
  result.appendChild(link);
}

function stamp(text) {
  return text ? text.replace("T", " ").slice(0, 19) + " UTC" : "-";
}

function hours(seconds) {
  return seconds >= 3600 ? `${fmt(seconds / 3600)} h` : seconds >= 60 ? `${fmt(seconds / 60)} min` : `${fmt(seconds)} s`;
}

// the runner's scheduled recheck (tuner/run/jobs.py): when it last ran and what it flagged
async function recheckJob() {
  let job;
  try {
    job = await getJSON("/api/configs/recheck");
  } catch (_) {
    return; // the entries' read reports errors
  }
  if (!job.scheduled) return;
  const line = $("recheck-job");
  const result = job.result || {};
  const regressed = (result.regressed || []).map((r) => `#${r.entry}`);
  const state = job.running ? `running since ${stamp(job.started_at)}` : `last run ${stamp(job.started_at)} to ${stamp(job.finished_at)}`;
  line.textContent =
    `Scheduled recheck (every ${hours(job.every_s)}, by ${job.owner || "?"}): ${state}; ` +
    `${result.checked || 0} of ${result.entries || 0} entries checked, ` +
    (regressed.length ? `regressed: ${regressed.join(", ")}` : "none regressed") +
    (result.error ? `; error: ${result.error}` : "") +
    `; next due ${stamp(job.next_due_at)}.`;
  line.dataset.regressed = String(regressed.length);
  line.classList.toggle("error", regressed.length > 0);
}

function registryPage() {
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    recheckJob();
    try {
      const page = await getJSON(`/api/configs/entries?${registryQuery()}`);
      const body = $("registry-table").querySelector("tbody");
      body.replaceChildren(...page.items.map(entryRow));
      $("registry-empty").hidden = page.total > 0;
      $("registry-count").textContent = `${page.total} entr${page.total === 1 ? "y" : "ies"}`;
      $("registry-error").hidden = true;
    } catch (error) {
      $("registry-error").textContent = `Could not read the registry: ${error.message}`;
      $("registry-error").hidden = false;
    }
    timer = setTimeout(refresh, POLL_MS);
  }
  for (const id of ["registry-workload", "registry-gpu", "registry-shape", "registry-status"]) {
    $(id).addEventListener("input", refresh);
  }
  refresh();
}

// ---------------------------------------------------------------- study page: warm-start origins
async function warmStartOrigins() {
  const studyId = document.body.dataset.studyId;
  if (!studyId || !$("warm-start-card")) return;
  let answer;
  try {
    answer = await getJSON(`/api/configs/origins/${studyId}`);
  } catch (_) {
    return; // the study page reports read errors itself
  }
  const decision = answer.warm_start;
  if (decision) {
    const line = $("warm-start-decision");
    line.dataset.mode = decision.mode;
    line.textContent =
      `Warm start: ${decision.mode} (asked: ${JSON.stringify(decision.requested)}). ${decision.reason}` +
      (decision.priors_note ? `. ${decision.priors_note}.` : ".");
    $("warm-start-card").hidden = false;
  }
  if (!answer.origins.length) return;
  const rows = answer.origins.map((origin) => {
    const tr = document.createElement("tr");
    tr.dataset.trial = String(origin.number);
    tr.dataset.source = origin.source;
    const trial = cell("");
    const link = document.createElement("a");
    link.href = `#trial-${origin.number}`;
    link.textContent = String(origin.number);
    trial.appendChild(link);
    tr.appendChild(trial);
    tr.appendChild(cell(origin.source === "registry" ? "registry" : "space seed"));
    tr.appendChild(cell(origin.shape ? pairs(origin.shape) : "-"));
    tr.appendChild(cell(origin.distance === undefined ? "-" : fmt(origin.distance)));
    tr.appendChild(cell(origin.value === undefined ? "-" : `${origin.objective} ${fmt(origin.value)}`));
    tr.appendChild(cell(origin.entry ? `#${origin.entry} (${origin.study || ""})` : "-"));
    return tr;
  });
  $("warm-start-table").querySelector("tbody").replaceChildren(...rows);
  $("warm-start-card").hidden = false;
}

function start() {
  const page = document.body.dataset.page;
  if (page === "registry") {
    setUpAuthForm();
    $("retune-form").addEventListener("submit", (event) => event.preventDefault()); // Enter in the token box
    registryPage();
  } else if (page === "study") warmStartOrigins();
}
start();
