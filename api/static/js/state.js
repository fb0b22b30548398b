/* The study page's state: what the page holds of the study, views of it every part reads, and the page's
 * actions (select a trial, reload, redraw) that study.js fills in, so that the parts call them without
 * importing the page's wiring.
 */
import { escapeHtml } from "./dom.js";
import { TERMINAL, fmtNum, fmtValue, isNum } from "./format.js";

export const POLL_MS = 2000;
export const TABLE_PAGE = 100; // trial table rows per page (the server sorts, filters and pages)
export const FRONT_SAMPLE = 150; // the front's points the page holds: all of them up to this, else a sample as many
// The trials the plots hold at most (beyond it every k-th, and the front): each SVG point costs draw time.
export const POINTS_SAMPLE = 400;

export const studyId = Number(document.body.dataset.studyId);
export const base = `/api/studies/${studyId}`;

export const S = {
  study: null,
  trials: [], // every trial as the plots draw it (params, metrics, status; no samples, no error text)
  table: { items: [], total: 0 }, // the trial table's current page, as GET /trials answers it
  tableOffset: 0,
  failures: [], // the latest failed, statically infeasible and constraint-violating trials, with their errors
  stride: 1, // the plots hold every trial (1), or every stride-th trial and the whole front
  seq: 0, // the study's change sequence the data above stands at (events go on from it)
  lightTimer: null,
  pareto: null, // the front as /pareto answers it: whole, or sampled along it (a large front) until asked for
  frontAll: false, // the whole front was asked for: refreshes fetch all of it
  parallelAll: false, // parallel coordinates were asked for (software WebGL draws a large study's on request)
  importances: null,
  importanceError: null,
  importanceAt: 0,
  selected: null,
  selectedDetail: null,
  sort: { key: "number", dir: 1 },
  filter: "",
  openFailures: new Set(),
  events: null,
  pollTimer: null,
  backupTimer: null,
  refreshing: null,
  refreshAgain: false,
  live: false,
  stamp: "",
  refreshes: 0,
  clock: null, // the last answer's elapsed time and ETA, and when it came (performance.now())
};

/** The page's actions, set by study.js: select a trial, fetch everything again, redraw everything. */
export const actions = {
  select: (_number) => {},
  refresh: (_force) => Promise.resolve(),
  renderAll: () => {},
};

export const objectives = () => (S.study && S.study.objectives) || [];
export const isTerminal = () => S.study && TERMINAL.has(S.study.status);
export const hasAll = (t, objs) => objs.every((o) => isNum(t.metrics[o.metric]));
export const feasibleOk = (t) => t.status === "ok" && t.feasible === true && t.duplicate_of == null;
export const violated = (t) => t.status === "ok" && t.feasible === false && t.duplicate_of == null;
export const frontNumbers = () => new Set(((S.pareto && S.pareto.trials) || []).map((t) => t.number));
export const spaceParams = () => (S.study && S.study.space && S.study.space.params) || {};

export function paramNames() {
  const names = Object.keys(spaceParams());
  for (const t of S.trials) for (const k of Object.keys(t.params || {})) if (!names.includes(k)) names.push(k);
  return names;
}

export function metricNames() {
  const names = objectives().map((o) => o.metric);
  const rest = new Set();
  for (const t of S.trials) for (const k of Object.keys(t.metrics || {})) if (!names.includes(k)) rest.add(k);
  return names.concat([...rest].sort());
}

/** Hover text of a trial: objectives then params, every user string escaped. */
export function hoverText(t, extraMetrics) {
  const lines = [`<b>trial #${t.number}</b>`];
  const shown = objectives()
    .map((o) => o.metric)
    .concat(extraMetrics || []);
  for (const m of shown)
    if (m in (t.metrics || {})) lines.push(`${escapeHtml(m)}: ${escapeHtml(fmtNum(t.metrics[m]))}`);
  const params = Object.entries(t.params || {});
  for (const [k, v] of params.slice(0, 16)) lines.push(`${escapeHtml(k)} = ${escapeHtml(fmtValue(v))}`);
  if (params.length > 16) lines.push(`… ${params.length - 16} more`);
  return lines.join("<br>");
}

/** The front as the page holds it: the whole front, or a sample spread along it (``total`` its size). */
export const frontShown = () => ((S.pareto && S.pareto.trials) || []).length;
export const frontTotal = () => (S.pareto && S.pareto.total !== undefined ? S.pareto.total : frontShown());
export const paretoPath = () => `${base}/pareto?${S.frontAll ? "all=true" : `sample=${FRONT_SAMPLE}`}`;

/** What the plots leave out of a very large study (the server bounds the points of the first draw). */
export function sampledNote() {
  if (!S.study) return "";
  const parts = [];
  const trials = S.study.counts ? Object.values(S.study.counts).reduce((a, b) => a + b, 0) : "the";
  if (S.stride > 1) parts.push(`every ${S.stride}th of ${trials} trials`);
  if (frontTotal() > frontShown())
    parts.push(`${frontShown()} of the front's ${frontTotal()} points, spread along it (every ${S.pareto.stride}th)`);
  else if (S.stride > 1) parts.push("the whole front");
  return parts.length ? ` Plots show ${parts.join(" and ")}.` : "";
}
