/* The study page's selected-trial panel: metrics, parameters, timing, the workload's report and the trial's
 * export in every format. */
import { $, h } from "./dom.js";
import { ROOT, downloadLink, getJSON } from "./api.js";
import { EXPORT_FORMATS, fileStem, fmtDuration, fmtNum, fmtTime, fmtValue, statusBadge } from "./format.js";
import { renderHistory, renderPareto } from "./plots.js";
import { S, base, frontNumbers, objectives } from "./state.js";
import { markSelectedRow } from "./table.js";

/** Select a trial: mark it in the plots and the table, show the list's copy, then its detail. */
export function selectTrial(number) {
  if (!Number.isInteger(number)) return;
  S.selected = number;
  S.selectedDetail = null;
  if (window.history && history.replaceState) history.replaceState(null, "", `#trial-${number}`);
  renderSelected();
  renderPareto();
  renderHistory();
  markSelectedRow(number);
  getJSON(`${base}/trials/${number}`)
    .then((detail) => {
      if (S.selected !== number) return;
      S.selectedDetail = detail;
      renderSelected();
    })
    .catch(() => {
      /* the list's copy of the trial is shown */
    });
}

function kvTable(entries) {
  const rows = entries.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)));
  return h("table", { class: "kv" }, h("tbody", {}, ...rows));
}

/** The trial's run: worker, attempt, duration, feasibility, its samples and the timing's interval. */
function runInfo(trial) {
  const info = [
    ["worker", fmtValue(trial.worker)],
    ["attempt", fmtValue(trial.attempt)],
    ["duration", fmtDuration(trial.duration_s)],
    ["finished", fmtTime(trial.finished_at)],
    ["feasible", fmtValue(trial.feasible)],
    ["timing comparable", fmtValue(trial.timing_comparable)],
  ];
  if (trial.duplicate_of !== null && trial.duplicate_of !== undefined)
    info.push(["duplicate of", `#${trial.duplicate_of}`]);
  if (Array.isArray(trial.samples_ms) && trial.samples_ms.length) {
    const sorted = [...trial.samples_ms].sort((a, b) => a - b);
    const median = sorted[Math.floor((sorted.length - 1) / 2)];
    info.push([
      "samples (ms)",
      `${sorted.length}: median ${fmtNum(median)}, min ${fmtNum(sorted[0])}, max ${fmtNum(sorted[sorted.length - 1])}`,
    ]);
  }
  const timing = trial.extra && trial.extra.timing;
  if (timing && Array.isArray(timing.ci95_ms) && timing.ci95_ms.length === 2) {
    info.push([
      "median 95% interval (ms)",
      `${fmtNum(timing.ci95_ms[0])} – ${fmtNum(timing.ci95_ms[1])} over ${fmtValue(timing.reps)} reps`,
    ]);
  }
  if (timing && timing.converged !== undefined && timing.converged !== null)
    info.push(["timing converged", `${fmtValue(timing.converged)} (±${fmtNum(100 * (timing.rel_ci ?? NaN))}%)`]);
  if (timing && timing.mode) info.push(["timing mode", fmtValue(timing.mode)]);
  return info;
}

/** The trial's export links (every format), or why there are none. */
function exportLinks(trial) {
  if (trial.status !== "ok") return h("p", { class: "muted" }, "Only successful trials can be exported.");
  const stem = `${fileStem(S.study && S.study.name)}-trial-${trial.number}`;
  const url = (fmt) => `${ROOT}${base}/export?format=${fmt}&trial=${trial.number}`;
  const [first, ...rest] = EXPORT_FORMATS;
  return h(
    "div",
    { class: "actions", id: "export-links" },
    h("span", { class: "label" }, "export"),
    downloadLink(
      { id: "export-link", class: "button primary", href: url(first.format), download: `${stem}.${first.suffix}` },
      `Export ${first.label}`,
    ),
    ...rest.map((f) =>
      downloadLink(
        { id: `export-link-${f.format}`, class: "button", href: url(f.format), download: `${stem}.${f.suffix}` },
        f.format,
      ),
    ),
  );
}

/** The trial shown: the detail once fetched, else the copy a list holds (table page, failures, plot points). */
function shownTrial(number) {
  const listed =
    (S.table.items || []).find((t) => t.number === number) ||
    S.failures.find((t) => t.number === number) ||
    S.trials.find((t) => t.number === number);
  return S.selectedDetail && S.selectedDetail.number === number ? S.selectedDetail : listed;
}

export function renderSelected() {
  const panel = $("selected-trial");
  const number = S.selected;
  const trial = shownTrial(number);
  panel.dataset.trial = number === null ? "" : String(number);
  if (!trial) {
    panel.replaceChildren(h("p", { class: "muted" }, `Trial #${number} is not in this study (yet).`));
    return;
  }
  const pick = S.pareto ? S.pareto.default_pick : null;
  const objs = new Set(objectives().map((o) => o.metric));
  const metricEntries = Object.entries(trial.metrics || {}).sort(
    (a, b) => Number(objs.has(b[0])) - Number(objs.has(a[0])),
  );
  const extraEntries = Object.entries(trial.extra || {}).filter(([k]) => k !== "timing");
  const title = h("h3", { id: "selected-trial-title" }, `Trial #${trial.number} `, statusBadge(trial.status));
  if (frontNumbers().has(trial.number))
    title.appendChild(h("span", { class: "muted" }, trial.number === pick ? " ★ default pick" : " ★ Pareto front"));
  panel.replaceChildren(
    ...[
      title,
      h("h3", {}, "Metrics"),
      metricEntries.length
        ? kvTable(metricEntries.map(([k, v]) => [k, fmtNum(v)]))
        : h("p", { class: "muted" }, "none"),
      h("h3", {}, "Parameters"),
      kvTable(Object.entries(trial.params || {}).map(([k, v]) => [k, fmtValue(v)])),
      exportLinks(trial),
      kvTable(runInfo(trial)),
      extraEntries.length
        ? h(
            "details",
            { id: "selected-trial-extra" },
            h("summary", {}, "workload report"),
            kvTable(extraEntries.map(([k, v]) => [k, fmtValue(v)])),
          )
        : null,
      trial.error ? h("details", {}, h("summary", {}, "error"), h("pre", {}, trial.error)) : null,
    ].filter(Boolean),
  );
}
