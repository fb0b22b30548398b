/* The study page's analysis plots, each from its own bounded endpoint: slice (an objective against one knob),
 * contour (an objective over two knobs), EDF (the distribution of each objective), hypervolume history (two
 * objectives) and best so far (against trials and against wall time). "Colour by" groups slice and EDF by a
 * categorical knob (kernel, precision, mode). Loaded after the page's first draw, and again at most every
 * REFRESH_MS while the study runs. */
import { $, escapeHtml, h, showNote } from "./dom.js";
import { ACCENT, draw, onFullPlotly, plotlyReady } from "./draw.js";
import { getJSON } from "./api.js";
import { base } from "./state.js";

const REFRESH_MS = 10000;
const PALETTE = ["#1c7ed6", "#d9480f", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#e03131", "#5c940d"];
const A = { space: null, data: {}, loadedAt: 0, loading: null };

const arrowOf = (direction) => (direction === "maximize" ? "max ↑" : "min ↓");
const title = (metric, direction) => ({ text: `${escapeHtml(metric)} (${arrowOf(direction)})` });
const color = (i) => PALETTE[i % PALETTE.length];

/** Fill the knob pickers from the study's space (once). */
function fillControls(space) {
  const params = Object.entries((space && space.params) || {});
  const categorical = params.filter(([, p]) => p.type === "categorical" || p.choices).map(([n]) => n);
  const names = params.map(([n]) => n);
  const fill = (id, options, chosen) => {
    const box = $(id);
    if (!box || box.options.length) return;
    for (const name of options) box.appendChild(h("option", { value: name, selected: name === chosen }, name));
  };
  fill("slice-param", names, names[0]);
  fill("contour-x", names, names[0]);
  fill("contour-y", names, names[1] || names[0]);
  fill("analysis-color", [""].concat(categorical), "");
  for (const id of ["slice-param", "contour-x", "contour-y", "analysis-color"]) {
    const box = $(id);
    if (box && !box.dataset.bound) {
      box.addEventListener("change", () => loadAnalysis(true));
      box.dataset.bound = "1";
    }
  }
}

async function fetchPart(name, path) {
  try {
    A.data[name] = await getJSON(path);
    A.data[`${name}Error`] = null;
  } catch (error) {
    A.data[name] = null;
    A.data[`${name}Error`] = error.message;
  }
}

/** Fetch every analysis endpoint (at most every REFRESH_MS unless ``force``), then draw. */
export function loadAnalysis(force, study) {
  if (study) A.study = study;
  if (!A.study || !$("analysis-card")) return Promise.resolve();
  if (A.loading) return A.loading;
  if (!force && Date.now() - A.loadedAt < REFRESH_MS) return Promise.resolve();
  A.loadedAt = Date.now();
  fillControls(A.study.space);
  const colorBy = $("analysis-color").value;
  const paint = colorBy ? `&color=${encodeURIComponent(colorBy)}` : "";
  const x = encodeURIComponent($("contour-x").value);
  const y = encodeURIComponent($("contour-y").value);
  const parts = [
    fetchPart("slice", `${base}/slice?param=${encodeURIComponent($("slice-param").value)}&limit=1500${paint}`),
    fetchPart("edf", `${base}/edf?limit=200${paint}`),
    fetchPart("best", `${base}/best?limit=400`),
  ];
  if (x && y && x !== y) parts.push(fetchPart("contour", `${base}/contour?x=${x}&y=${y}&bins=20&limit=800`));
  else A.data.contour = null;
  if ((A.study.objectives || []).length === 2) parts.push(fetchPart("hv", `${base}/hypervolume?limit=400`));
  A.loading = Promise.all(parts)
    .then(() => plotlyReady)
    .then(renderAnalysis)
    .finally(() => {
      A.loading = null;
    });
  return A.loading;
}

/** Draw every analysis plot from what was fetched. */
export function renderAnalysis() {
  if (!$("analysis-card")) return;
  renderSlice();
  renderContour();
  renderEdf();
  renderHypervolume();
  renderBest();
  document.body.dataset.analysisDrawn = String(Number(document.body.dataset.analysisDrawn || 0) + 1);
}

/** Points split by their ``group`` (the colour knob's value), one trace a group. */
function byGroup(points) {
  const groups = new Map();
  for (const p of points) {
    const key = p.group === undefined ? "trials" : String(p.group);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(p);
  }
  return [...groups.entries()];
}

function renderSlice() {
  const body = A.data.slice;
  showNote("slice-note", A.data.sliceError || (body && body.stride > 1 ? `every ${body.stride}th trial` : ""));
  if (!body) return;
  const traces = byGroup(body.points).map(([name, list], i) => ({
    type: "scatter",
    mode: "markers",
    name: escapeHtml(name),
    x: list.map((p) => (typeof p.value === "number" ? p.value : escapeHtml(p.value))),
    y: list.map((p) => p.objective),
    customdata: list.map((p) => p.number),
    hovertext: list.map((p) => `trial ${p.number}${p.feasible ? "" : " (constraint violated)"}`),
    marker: { color: color(i), size: 7, opacity: 0.8, symbol: list.map((p) => (p.feasible ? "circle" : "x")) },
  }));
  draw($("slice-plot"), traces, {
    xaxis: {
      title: { text: escapeHtml(body.param) },
      type: body.kind === "categorical" ? "category" : body.log ? "log" : "linear",
    },
    yaxis: { title: title(body.objective, body.direction) },
    showlegend: traces.length > 1,
  });
}

function renderContour() {
  const body = A.data.contour;
  showNote("contour-note", A.data.contourError || (!body ? "choose two different params" : ""));
  if (!body) return;
  const numeric = body.x_cells.every((v) => typeof v === "number") && body.y_cells.every((v) => typeof v === "number");
  const text = (v) => (typeof v === "number" ? v : escapeHtml(v)); // category names are tick labels
  const grid = {
    type: numeric ? "contour" : "heatmap",
    x: body.x_cells.map(text),
    y: body.y_cells.map(text),
    z: body.z,
    connectgaps: numeric,
    colorscale: "Viridis",
    reversescale: body.direction === "minimize",
    colorbar: { title: { text: escapeHtml(body.objective) } },
    hoverongaps: false,
  };
  const points = {
    type: "scatter",
    mode: "markers",
    name: "trials",
    x: body.points.map((p) => text(p.x)),
    y: body.points.map((p) => text(p.y)),
    customdata: body.points.map((p) => p.number),
    hovertext: body.points.map((p) => `trial ${p.number}: ${p.objective}`),
    marker: { color: "#fff", size: 5, line: { color: "#212529", width: 1 } },
  };
  draw($("contour-plot"), [grid, points], {
    xaxis: { title: { text: escapeHtml(body.x) }, type: numeric ? "linear" : "category" },
    yaxis: { title: { text: escapeHtml(body.y) }, type: numeric ? "linear" : "category" },
    showlegend: false,
  });
}

function renderEdf() {
  const body = A.data.edf;
  showNote("edf-note", A.data.edfError || "");
  if (!body || !body.curves.length) return;
  const metrics = [...new Set(body.curves.map((c) => c.metric))];
  const traces = body.curves.map((c, i) => ({
    type: "scatter",
    mode: "lines",
    line: { shape: "hv", color: color(i) },
    name: escapeHtml(c.group === undefined ? c.metric : `${c.metric}: ${c.group}`),
    x: c.values,
    y: c.fraction,
    xaxis: metrics.indexOf(c.metric) ? `x${metrics.indexOf(c.metric) + 1}` : "x",
  }));
  const layout = { yaxis: { title: { text: "fraction of trials ≤ value" }, range: [0, 1.02] }, showlegend: true };
  metrics.forEach((metric, i) => {
    const curve = body.curves.find((c) => c.metric === metric);
    const share = 1 / metrics.length;
    layout[i ? `xaxis${i + 1}` : "xaxis"] = {
      title: title(metric, curve.direction),
      domain: [i * share + (i ? 0.04 : 0), (i + 1) * share - 0.04],
      anchor: "y",
    };
  });
  draw($("edf-plot"), traces, layout);
}

function renderHypervolume() {
  const body = A.data.hv;
  const card = $("hypervolume-plot");
  if ((A.study.objectives || []).length !== 2) {
    showNote("hypervolume-note", "Hypervolume history needs a study of two objectives.");
    return;
  }
  if (!body) {
    showNote("hypervolume-note", A.data.hvError || "");
    return;
  }
  const ref = Object.entries(body.reference_point)
    .map(([m, v]) => `${m} = ${Number(v).toPrecision(4)}`)
    .join(", ");
  showNote("hypervolume-note", `Reference point: ${ref}.`);
  draw(
    card,
    [
      {
        type: "scatter",
        mode: "lines+markers",
        line: { shape: "hv", color: ACCENT },
        name: "hypervolume",
        x: body.history.map((p) => p.number),
        y: body.history.map((p) => p.hypervolume),
        customdata: body.history.map((p) => p.number),
      },
    ],
    { xaxis: { title: { text: "trial" } }, yaxis: { title: { text: "hypervolume" } }, showlegend: false },
  );
}

function renderBest() {
  const body = A.data.best;
  showNote("best-note", A.data.bestError || "");
  if (!body) return;
  for (const [id, key, axis] of [
    ["best-trial-plot", "by_trial", "trial"],
    ["best-time-plot", "by_time", "wall time (s)"],
  ]) {
    const traces = body.objectives.map((o, i) => ({
      type: "scatter",
      mode: "lines+markers",
      line: { shape: "hv", color: color(i) },
      name: escapeHtml(`${o.metric} (${arrowOf(o.direction)})`),
      x: o[key].map((p) => p.x),
      y: o[key].map((p) => p.best),
      customdata: o[key].map((p) => p.number),
      yaxis: i ? "y2" : "y",
    }));
    const layout = { xaxis: { title: { text: axis } }, showlegend: true, legend: { orientation: "h", y: 1.15 } };
    if (body.objectives[0]) layout.yaxis = { title: title(body.objectives[0].metric, body.objectives[0].direction) };
    if (body.objectives[1]) {
      const o = body.objectives[1];
      layout.yaxis2 = { title: title(o.metric, o.direction), overlaying: "y", side: "right" };
      layout.margin = { l: 64, r: 72, t: 30, b: 56 }; // room for the right axis' title beside its ticks
    }
    draw($(id), traces, layout);
  }
}

onFullPlotly(renderAnalysis);
