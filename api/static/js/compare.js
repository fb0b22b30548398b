/* The compare page (/compare?studies=1,2,...): best so far, EDF and the fronts of several studies overlaid,
 * and their default picks side by side with each one's ratio to the first study's. The studies must share a
 * workload and objectives; else the page says which differ and draws nothing. */
import { $, escapeHtml, h, setConnection, showNote } from "./dom.js";
import { ROOT, askForToken, getJSON, setUpAuthForm } from "./api.js";
import { draw, plotlyReady } from "./draw.js";
import { fmtNum } from "./format.js";

const PALETTE = ["#1c7ed6", "#d9480f", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#e03131", "#5c940d"];
const ids = (document.body.dataset.studyIds || "").split(",").filter(Boolean).map(Number);
const label = (study) => `#${study.id} ${study.name}`;
const arrowOf = (direction) => (direction === "maximize" ? "max ↑" : "min ↓");
const axis = (o) => ({ title: { text: `${escapeHtml(o.metric)} (${arrowOf(o.direction)})` } });

/** Why these studies cannot be compared (different workloads or objectives), or "". */
export function mismatch(studies) {
  const key = (s) => JSON.stringify((s.objectives || []).map((o) => [o.metric, o.direction]));
  const first = studies[0];
  for (const s of studies.slice(1)) {
    if (s.workload !== first.workload) return `${label(s)} runs ${s.workload}, ${label(first)} runs ${first.workload}`;
    if (key(s) !== key(first)) return `${label(s)} and ${label(first)} have different objectives`;
  }
  return "";
}

async function load() {
  const studies = await Promise.all(ids.map((id) => getJSON(`/api/studies/${id}`)));
  $("compare-studies").replaceChildren(
    ...studies.map((s, i) => h("a", { href: `${ROOT}/studies/${s.id}`, style: `color:${PALETTE[i]}` }, label(s), " ")),
  );
  const why = studies.length < 2 ? "choose at least two studies" : mismatch(studies);
  if (why) {
    showNote("compare-error", `These studies cannot be compared: ${why}.`);
    document.body.dataset.compareDrawn = "refused";
    return;
  }
  const parts = await Promise.all(
    studies.map((s) =>
      Promise.all([
        getJSON(`/api/studies/${s.id}/best?limit=400`),
        getJSON(`/api/studies/${s.id}/edf?limit=200`),
        getJSON(`/api/studies/${s.id}/pareto?sample=300`),
      ]),
    ),
  );
  await plotlyReady;
  drawBest(studies, parts.map((p) => p[0]));
  drawEdf(studies, parts.map((p) => p[1]));
  drawFronts(studies, parts.map((p) => p[2]));
  renderPicks(studies);
  document.body.dataset.compareDrawn = "1";
  setConnection(`updated ${new Date().toLocaleTimeString()}`);
}

function drawBest(studies, bests) {
  const objective = studies[0].objectives[0];
  const traces = bests.map((b, i) => ({
    type: "scatter",
    mode: "lines+markers",
    line: { shape: "hv", color: PALETTE[i % PALETTE.length] },
    name: escapeHtml(label(studies[i])),
    x: b.objectives[0].by_trial.map((p) => p.x),
    y: b.objectives[0].by_trial.map((p) => p.best),
  }));
  draw($("compare-best-plot"), traces, { xaxis: { title: { text: "trial" } }, yaxis: axis(objective) });
}

function drawEdf(studies, edfs) {
  const objective = studies[0].objectives[0];
  const traces = edfs.map((e, i) => {
    const curve = e.curves.find((c) => c.metric === objective.metric) || { values: [], fraction: [] };
    return {
      type: "scatter",
      mode: "lines",
      line: { shape: "hv", color: PALETTE[i % PALETTE.length] },
      name: escapeHtml(label(studies[i])),
      x: curve.values,
      y: curve.fraction,
    };
  });
  draw($("compare-edf-plot"), traces, {
    xaxis: axis(objective),
    yaxis: { title: { text: "fraction of trials ≤ value" }, range: [0, 1.02] },
  });
}

function drawFronts(studies, fronts) {
  const objectives = studies[0].objectives;
  if (objectives.length < 2) {
    showNote("compare-front-note", "One objective: each study's front is its best trial (in the table below).");
    return;
  }
  const [a, b] = objectives;
  const traces = fronts.map((f, i) => ({
    type: "scatter",
    mode: "lines+markers",
    line: { shape: "hv", color: PALETTE[i % PALETTE.length] },
    name: escapeHtml(label(studies[i])),
    x: f.trials.map((t) => t.metrics[a.metric]),
    y: f.trials.map((t) => t.metrics[b.metric]),
    hovertext: f.trials.map((t) => `trial ${t.number}`),
  }));
  draw($("compare-front-plot"), traces, { xaxis: axis(a), yaxis: axis(b) });
}

/** Each study's default pick: its objectives' values and the ratio to the first study's, and its params. */
function renderPicks(studies) {
  const objectives = studies[0].objectives;
  const first = studies[0].best;
  const head = ["study", "pick", ...objectives.map((o) => `${o.metric} (${arrowOf(o.direction)})`), "params"];
  $("compare-table").querySelector("thead tr").replaceChildren(...head.map((t) => h("th", {}, t)));
  const rows = studies.map((s) => {
    const cells = objectives.map((o) => {
      const value = s.best ? s.best.metrics[o.metric] : null;
      const base = first ? first.metrics[o.metric] : null;
      const ratio = value != null && base ? ` (×${fmtNum(value / base)})` : "";
      return h("td", { class: "num" }, value == null ? "–" : `${fmtNum(value)}${ratio}`);
    });
    const params = s.best ? Object.entries(s.best.params).map(([k, v]) => `${k}=${v}`).join(", ") : "";
    return h(
      "tr",
      { "data-study-id": s.id },
      h("td", {}, h("a", { href: `${ROOT}/studies/${s.id}` }, label(s))),
      h("td", { class: "num" }, s.best ? s.best.trial : "–"),
      ...cells,
      h("td", {}, params),
    );
  });
  $("compare-table").querySelector("tbody").replaceChildren(...rows);
}

function start() {
  setUpAuthForm();
  load().catch((error) => {
    if (error.status === 401) {
      askForToken(start);
      return;
    }
    showNote("compare-error", `Could not load the studies: ${error.message}`);
  });
}

start();
