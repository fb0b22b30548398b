/* The study page's parallel coordinates: one axis per parameter, the first objective last (WebGL). */
import { $, escapeHtml, h, showNote } from "./dom.js";
import { clearPlot, draw, webglIsSoftware } from "./draw.js";
import { arrow, fmtNum, isNum, maxOf, minOf } from "./format.js";
import { S, feasibleOk, objectives, paramNames, spaceParams } from "./state.js";

const PARCOORDS_MAX = 5000; // parallel coordinates draw the best this many trials
const PARCOORDS_SOFTWARE = 200; // where WebGL renders in software, more trials than this wait to be asked for

function niceTicks(lo, hi, count) {
  if (lo === hi) return [lo];
  const step = (hi - lo) / (count - 1);
  return Array.from({ length: count }, (_, i) => lo + i * step);
}

/** A numeric parameter's axis: values as they are (pow2 on a log2 axis), missing ones below at "n/a". */
function numericDimension(label, spec, values, present) {
  const missing = present.length < values.length;
  const log2 = spec.type === "pow2" && present.every((v) => v > 0);
  const pos = (v) => (log2 ? Math.log2(v) : v);
  const lo = minOf(present.map(pos));
  const hi = maxOf(present.map(pos));
  const span = hi - lo || 1;
  const na = lo - 0.15 * span;
  if (!log2 && !missing) return { label, values: values.map(pos) };
  const ticks = log2 ? Array.from({ length: Math.round(hi - lo) + 1 }, (_, i) => lo + i) : niceTicks(lo, hi, 5);
  const tickvals = (missing ? [na] : []).concat(ticks);
  const ticktext = (missing ? ["n/a"] : []).concat(ticks.map((t) => fmtNum(log2 ? 2 ** t : t)));
  return {
    label: log2 ? `${label} (log2)` : label,
    values: values.map((v) => (v === undefined || v === null ? na : pos(v))),
    tickvals,
    ticktext,
    range: [missing ? na : lo, hi],
  };
}

/** One parcoords dimension per param: numbers as they are (pow2 on a log2 axis), categories as indices.
 *  Plotly renders a dimension's label as HTML (escaped here) but its tick text as plain text (not escaped). */
function dimension(name, values) {
  const spec = spaceParams()[name] || {};
  const present = values.filter((v) => v !== undefined && v !== null);
  const label = escapeHtml(name);
  const numeric = present.length > 0 && present.every((v) => isNum(v)) && spec.type !== "categorical";
  if (numeric) return numericDimension(label, spec, values, present);
  const categories = (spec.choices || []).map(String);
  for (const v of present) if (!categories.includes(String(v))) categories.push(String(v));
  if (present.length < values.length) categories.push("n/a");
  const index = (v) => categories.indexOf(v === undefined || v === null ? "n/a" : String(v));
  const short = (c) => (c.length > 40 ? `${c.slice(0, 39)}…` : c);
  return {
    label,
    values: values.map(index),
    tickvals: categories.map((_, i) => i),
    ticktext: categories.map(short), // parcoords draws tick text as plain text (labels, unlike ticks, are HTML)
    range: [0, Math.max(1, categories.length - 1)],
  };
}

/** Where WebGL renders in software, a large study's plot waits for a click (true: it waits). */
function waitForRequest(div, count) {
  if (!webglIsSoftware() || S.parallelAll || count <= PARCOORDS_SOFTWARE) return false;
  clearPlot(div);
  showNote(
    "parallel-note",
    `WebGL renders in software in this browser: parallel coordinates of ${count} trials would take ` +
      "about ten seconds, so they are drawn on request. ",
  );
  $("parallel-note").append(
    h("button", { type: "button", id: "draw-parallel", onclick: () => ((S.parallelAll = true), renderParallel()) },
      "Draw parallel coordinates"),
  );
  return true;
}

export function renderParallel() {
  const div = $("parallel-plot");
  const objective = objectives()[0];
  if (!objective) return;
  const metric = objective.metric;
  let trials = S.trials.filter((t) => feasibleOk(t) && isNum(t.metrics[metric]));
  if (trials.length < 2) {
    showNote("parallel-note", "Needs at least two feasible successful trials.");
    clearPlot(div);
    return;
  }
  if (waitForRequest(div, trials.length)) return;
  if (trials.length > PARCOORDS_MAX) {
    const sign = objective.direction === "maximize" ? -1 : 1;
    const all = trials.length;
    trials = trials.sort((a, b) => sign * (a.metrics[metric] - b.metrics[metric])).slice(0, PARCOORDS_MAX);
    showNote("parallel-note", `The best ${PARCOORDS_MAX} of ${all} feasible trials.`);
  } else {
    showNote("parallel-note", "");
  }
  const dims = paramNames().map((name) =>
    dimension(
      name,
      trials.map((t) => (t.params || {})[name]),
    ),
  );
  const scores = trials.map((t) => t.metrics[metric]);
  dims.push({ label: `${escapeHtml(metric)} ${arrow(objective.direction)}`, values: scores });
  draw(
    div,
    [
      {
        type: "parcoords",
        dimensions: dims,
        line: {
          color: scores,
          colorscale: "Viridis",
          reversescale: objective.direction === "minimize",
          showscale: true,
          colorbar: { title: { text: escapeHtml(metric) }, thickness: 12 },
        },
        labelangle: -20,
      },
    ],
    { margin: { l: 60, r: 40, t: 60, b: 30 } },
  );
}
