/* The study page's plots of its objectives: the Pareto front (2 or 3 objectives), the optimization history
 * and the parameter importances. Points are clickable: a click selects the trial. */
import { $, escapeHtml, h, setConnection, showNote } from "./dom.js";
import { ACCENT, axisTitle, clearPlot, draw, scatterType } from "./draw.js";
import { getJSON } from "./api.js";
import { fmtNum, isNum, maxOf } from "./format.js";
import {
  S,
  actions,
  feasibleOk,
  frontShown,
  frontTotal,
  hasAll,
  hoverText,
  objectives,
  paretoPath,
  sampledNote,
  violated,
} from "./state.js";

const select = (number) => actions.select(number);

/** Fetch the whole front (on request: a large front is sampled on load) and redraw. */
async function loadWholeFront() {
  S.frontAll = true;
  try {
    S.pareto = await getJSON(paretoPath());
    actions.renderAll();
  } catch (error) {
    setConnection(`could not load the whole front (${error.message})`);
  }
}

/** The front plot's traces: every trial, the violating ones, the front, the default pick, the selection. */
function paretoTraces(used, sets) {
  const three = used.length === 3;
  const coords = (list) => {
    const c = { x: list.map((t) => t.metrics[used[0].metric]), y: list.map((t) => t.metrics[used[1].metric]) };
    if (three) c.z = list.map((t) => t.metrics[used[2].metric]);
    return c;
  };
  const trace = (name, list, style) =>
    Object.assign(
      {
        type: three ? "scatter3d" : scatterType(sets.points.length),
        mode: "markers",
        name,
        customdata: list.map((t) => t.number),
        hovertext: list.map((t) => hoverText(t)),
        hoverinfo: "text",
      },
      coords(list),
      style,
    );
  const size = three ? 0.6 : 1;
  return [
    trace("trials", sets.points, { marker: { color: "#adb5bd", size: 8 * size, opacity: 0.85 } }),
    trace("constraint violated", sets.bad, {
      marker: { color: "#ffa8a8", size: 8 * size, symbol: three ? "x" : "x-thin-open" },
    }),
    trace("Pareto front", sets.front, {
      mode: three ? "markers" : "lines+markers",
      line: { color: ACCENT, width: 1.5, dash: "dot" },
      marker: { color: ACCENT, size: 11 * size, line: { color: "#fff", width: 1 } },
    }),
    trace("default pick", sets.pick ? [sets.pick] : [], {
      marker: {
        color: "#f59f00",
        size: 18 * size,
        symbol: three ? "diamond" : "star",
        line: { color: "#7a4a00", width: 1 },
      },
    }),
    trace("selected", sets.selected ? [sets.selected] : [], {
      marker: {
        color: "rgba(0,0,0,0)",
        size: 22 * size,
        line: { color: "#1d2330", width: 2.5 },
        symbol: three ? "circle-open" : "circle",
      },
      hoverinfo: "skip",
      showlegend: false,
    }),
  ];
}

function paretoLayout(used) {
  if (used.length === 3)
    return {
      scene: {
        xaxis: { title: axisTitle(used[0], true) },
        yaxis: { title: axisTitle(used[1], true) },
        zaxis: { title: axisTitle(used[2], true) },
        camera: { eye: { x: 1.7, y: 1.7, z: 1.1 } },
      },
      margin: { l: 0, r: 0, t: 30, b: 0 },
      legend: { orientation: "h", y: 1.08 },
    };
  return {
    xaxis: { title: axisTitle(used[0]), zeroline: false },
    yaxis: { title: axisTitle(used[1]), zeroline: false },
    legend: { orientation: "h", y: 1.12 },
  };
}

export function renderPareto() {
  const div = $("pareto-plot");
  const objs = objectives();
  if (objs.length < 2) {
    $("pareto-title").textContent = "Pareto front";
    showNote("pareto-note", "One objective: there is no front to draw; the history plot shows its progress.");
    clearPlot(div);
    return;
  }
  const used = objs.slice(0, 3);
  const points = S.trials.filter((t) => feasibleOk(t) && hasAll(t, used));
  const bad = S.trials.filter((t) => violated(t) && hasAll(t, used));
  const front = ((S.pareto && S.pareto.trials) || []).filter((t) => hasAll(t, used));
  const pickNumber = S.pareto ? S.pareto.default_pick : null;
  const pick = front.find((t) => t.number === pickNumber) || points.find((t) => t.number === pickNumber);
  const selected = S.trials.find((t) => t.number === S.selected && hasAll(t, used) && t.status === "ok");
  showNote(
    "pareto-note",
    (points.length ? "" : "No feasible successful trial yet. ") +
      (objs.length > 3 ? `Showing the first three of ${objs.length} objectives.` : "") +
      sampledNote(),
  );
  if (frontTotal() > frontShown())
    $("pareto-note").append(
      " ",
      h(
        "button",
        { type: "button", id: "whole-front", onclick: loadWholeFront },
        `Load all ${frontTotal()} front points`,
      ),
    );
  const three = used.length === 3;
  $("pareto-title").textContent = three ? "Pareto front (3 objectives)" : "Pareto front";
  if (front.length > 1 && !three) front.sort((a, b) => a.metrics[used[0].metric] - b.metrics[used[0].metric]);
  draw(div, paretoTraces(used, { points, bad, front, pick, selected }), paretoLayout(used), select);
}

/** The best value so far at each feasible trial, carried on to the last trial number. */
function bestSoFar(feasible, metric, better) {
  const x = [];
  const y = [];
  let best = null;
  for (const t of feasible) {
    const v = t.metrics[metric];
    if (best === null || better(v, best)) best = v;
    x.push(t.number);
    y.push(best);
  }
  if (x.length && S.trials.length) {
    const last = maxOf(S.trials.map((t) => t.number));
    if (last > x[x.length - 1]) {
      x.push(last);
      y.push(best);
    }
  }
  return { x, y };
}

function historyTraces(metric, feasible, bad, best, selected) {
  const kind = scatterType(feasible.length + bad.length);
  const points = (name, list, marker) => ({
    type: kind,
    mode: "markers",
    name,
    x: list.map((t) => t.number),
    y: list.map((t) => t.metrics[metric]),
    customdata: list.map((t) => t.number),
    hovertext: list.map((t) => hoverText(t)),
    hoverinfo: "text",
    marker,
  });
  return [
    points(escapeHtml(metric), feasible, { color: "#4c6ef5", size: 7 }), // legend text is HTML too
    points("constraint violated", bad, { color: "#ffa8a8", size: 8, symbol: "x-thin-open" }),
    {
      type: "scatter",
      mode: "lines",
      name: "best so far",
      x: best.x,
      y: best.y,
      line: { color: ACCENT, width: 2, shape: "hv" },
      hoverinfo: "x+y",
    },
    {
      type: "scatter",
      mode: "markers",
      name: "selected",
      x: selected ? [selected.number] : [],
      y: selected ? [selected.metrics[metric]] : [],
      marker: { color: "rgba(0,0,0,0)", size: 18, line: { color: "#1d2330", width: 2.5 } },
      hoverinfo: "skip",
      showlegend: false,
    },
  ];
}

export function renderHistory() {
  const div = $("history-plot");
  const objective = objectives()[0];
  if (!objective) return;
  const metric = objective.metric;
  const better = (a, b) => (objective.direction === "maximize" ? a > b : a < b);
  const done = S.trials.filter((t) => (feasibleOk(t) || violated(t)) && isNum(t.metrics[metric]));
  done.sort((a, b) => a.number - b.number);
  const feasible = done.filter(feasibleOk);
  const bad = done.filter(violated);
  showNote("history-note", (feasible.length ? "" : "No feasible successful trial yet.") + sampledNote());
  const selected = feasible.concat(bad).find((t) => t.number === S.selected);
  draw(
    div,
    historyTraces(metric, feasible, bad, bestSoFar(feasible, metric, better), selected),
    {
      xaxis: { title: { text: "trial number" }, zeroline: false },
      yaxis: { title: axisTitle(objective), zeroline: false },
      legend: { orientation: "h", y: 1.12 },
    },
    select,
  );
}

export function renderImportance() {
  const div = $("importance-plot");
  if (S.importances !== null) document.body.dataset.importances = "drawn"; // after the first draw (tests wait on it)
  const entries = Object.entries(S.importances || {}).filter(([, v]) => isNum(v));
  if (!entries.length) {
    showNote(
      "importance-note",
      S.importanceError ? `Importances unavailable: ${S.importanceError}` : "Not enough trials yet.",
    );
    clearPlot(div);
    return;
  }
  showNote("importance-note", "");
  entries.sort((a, b) => a[1] - b[1]); // largest on top of a horizontal bar chart
  const objective = objectives()[0];
  draw(
    div,
    [
      {
        type: "bar",
        orientation: "h",
        x: entries.map(([, v]) => v),
        y: entries.map(([k]) => escapeHtml(k)),
        hovertext: entries.map(([k, v]) => `${escapeHtml(k)}: ${fmtNum(v)}`),
        hoverinfo: "text",
        marker: { color: "#4c6ef5" },
      },
    ],
    {
      xaxis: {
        title: { text: `importance for ${escapeHtml(objective ? objective.metric : "the objective")}` },
        rangemode: "tozero",
      },
      yaxis: { automargin: true },
      margin: { l: 100, r: 20, t: 20, b: 50 },
    },
  );
}
