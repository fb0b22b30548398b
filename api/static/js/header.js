/* The study page's header: name, status, progress, elapsed time and ETA, best trial, the default pick's
 * exports, and Stop / Resume. */
import { $, h } from "./dom.js";
import { ROOT, postAction, storedToken, tokenAwareDownload } from "./api.js";
import { EXPORT_FORMATS, TERMINAL, arrow, bestText, failedCount, fileStem, fmtDuration, isNum } from "./format.js";
import { S, actions, base, objectives } from "./state.js";

/** "12/40 measured (2 running, 1 failed, ...)". */
function progressText(study) {
  const counts = study.counts || {};
  const running = study.running !== undefined ? study.running : counts.running || 0;
  const extras = [];
  if (running) extras.push(`${running} running`);
  if (failedCount(counts)) extras.push(`${failedCount(counts)} failed`);
  if (counts.infeasible_static) extras.push(`${counts.infeasible_static} statically infeasible, not run`);
  if (counts.duplicate) extras.push(`${counts.duplicate} duplicates, not run`);
  return `${study.measured}/${study.budget_trials} measured` + (extras.length ? ` (${extras.join(", ")})` : "");
}

function renderBest(study) {
  const best = $("study-best");
  best.replaceChildren();
  if (!study.best) {
    best.textContent = "–";
    return;
  }
  const select = (event) => (event.preventDefault(), actions.select(study.best.trial));
  best.appendChild(h("a", { href: `#trial-${study.best.trial}`, onclick: select }, bestText(study)));
}

/** The sampler's replaced proposals (inside its proposal step: not trial rows). */
function renderProposals(study) {
  const proposals = $("study-proposals");
  const replaced = study.proposals || null;
  proposals.hidden = !replaced;
  proposals.textContent = replaced
    ? `replaced proposals: ${replaced.repeats_replaced || 0} duplicates, ` +
      `${replaced.static_rejected || 0} statically infeasible (not trials)`
    : "";
}

/** How the trials are timed (a kernel workload's ``timing`` arg), as the exports say it. */
function renderTiming(study) {
  const timing = $("study-timing");
  timing.hidden = !study.timing;
  timing.textContent = study.timing ? `timed ${study.timing.mode}: ${study.timing.means}` : "";
}

/** The default pick's export links, one per format (as the trial panel offers). */
function renderExports(study) {
  const stem = fileStem(study.name);
  for (const { format, suffix } of EXPORT_FORMATS) {
    const link = $(`export-best-${format}`);
    link.href = `${ROOT}${base}/export?format=${format}`;
    link.setAttribute("download", `${stem}-best.${suffix}`);
    link.classList.toggle("disabled", !study.best);
  }
}

export function renderHeader() {
  const study = S.study;
  if (!study) return;
  document.title = `${study.name} · gpu-knob-tuner`;
  $("study-name").textContent = study.name;
  $("study-workload").textContent = study.workload;
  const status = $("study-status");
  status.textContent = study.status;
  status.className = `badge status-${String(study.status).replace(/[^a-z_]/g, "")}`;
  document.body.dataset.studyStatus = study.status;
  $("study-objectives").textContent = objectives()
    .map((o) => `${o.metric} ${arrow(o.direction)}`)
    .join(", ");
  const bar = $("study-progress-bar");
  bar.style.width = `${Math.round(100 * Math.max(0, Math.min(1, study.progress || 0)))}%`;
  bar.classList.toggle("done", TERMINAL.has(study.status));
  $("study-progress-text").textContent = progressText(study);
  S.clock = { at: performance.now(), elapsed: study.elapsed_s, eta: study.eta_s, status: study.status };
  tickClock();
  renderBest(study);
  const message = $("study-message");
  message.textContent = study.message || "";
  message.hidden = !study.message;
  renderProposals(study);
  renderTiming(study);
  renderExports(study);
  $("stop-button").hidden = TERMINAL.has(study.status) || study.status === "stopping";
  $("resume-button").hidden = !TERMINAL.has(study.status) || study.status === "completed";
  $("timing-note").hidden = !S.trials.some((t) => t.status === "ok" && t.timing_comparable === false);
}

/** Elapsed time moves on between the server's answers (from the last answer, one tick a second). The ETA is
 *  the API's ``eta_s`` as the last answer gave it: the server's estimate, never one of the page's. */
export function tickClock() {
  const c = S.clock;
  if (!c) return;
  const live = c.status === "running" || c.status === "stopping";
  const since = live ? (performance.now() - c.at) / 1000 : 0;
  $("study-elapsed").textContent = fmtDuration(isNum(c.elapsed) ? c.elapsed + since : c.elapsed);
  $("study-eta").textContent = TERMINAL.has(c.status) || !isNum(c.eta) ? "–" : fmtDuration(c.eta);
}

// The server renders the token box only when it has a token (data-writes-need-token): on a server
// without one, Stop and Resume send no token; on one with a token, a refusal says so plainly.
async function control(action) {
  const out = $("control-result");
  const needsToken = document.body.dataset.writesNeedToken === "1";
  const box = $("api-token");
  const token = (box ? box.value.trim() : "") || storedToken();
  if (needsToken && !token) {
    out.textContent = "this server needs its API token (TUNER_API_TOKEN) for stop and resume: enter it first";
    return;
  }
  out.textContent = `${action}: sending...`;
  try {
    const answer = await postAction(`${base}/${action}`, needsToken ? token : "");
    if (answer.status === 401) {
      out.textContent = "the server refused this token (401): it is not the server's TUNER_API_TOKEN";
    } else {
      out.textContent = answer.ok ? `${action} requested` : `${answer.status} ${answer.detail}`;
    }
  } catch (error) {
    out.textContent = error.message;
  }
  await actions.refresh(true);
}

/** The default pick's export links, Stop and Resume. */
export function bindHeaderControls() {
  for (const { format } of EXPORT_FORMATS) tokenAwareDownload($(`export-best-${format}`));
  $("control-form").addEventListener("submit", (event) => event.preventDefault());
  $("stop-button").addEventListener("click", () => control("stop"));
  $("resume-button").addEventListener("click", () => control("resume"));
}
