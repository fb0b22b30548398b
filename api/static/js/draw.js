/* Plotly on the study page: the bundles' loading, WebGL's kind, and drawing into a plot's div.
 *
 * The study page loads Plotly after its script (its first request is under way meanwhile), and the basic
 * bundle first (scatter and bar: a quarter of the full bundle's compile time). A plot that needs another
 * trace type asks for the full bundle (``data-full``); once it is in, every plot is drawn again with it.
 */
import { escapeHtml } from "./dom.js";
import { arrow } from "./format.js";

export const ACCENT = "#d9480f";
const WEBGL_FROM = 2000; // scatter plots of more points than this draw through WebGL
const PLOT_CONFIG = {
  responsive: true,
  displaylogo: false,
  modeBarButtonsToRemove: ["lasso2d", "select2d"],
};

export const hasPlotly = () => typeof window.Plotly !== "undefined";

const PLOTLY_TAG = document.getElementById("plotly-script");
const BASIC_TRACES = new Set(["scatter", "bar", "pie"]);
let plotlyFull = !(PLOTLY_TAG && PLOTLY_TAG.dataset.full && !/\/plotly\.min\.js$/.test(PLOTLY_TAG.src));
let fullPlotly = null; // the full bundle's load, once asked for
const redraws = []; // what to draw again once the full bundle is in

/** Resolves once the Plotly script has run (or failed to load): deferred scripts run in order, after this one. */
export const plotlyReady = new Promise((resolve) => {
  if (hasPlotly() || !PLOTLY_TAG || document.readyState === "complete") return resolve();
  PLOTLY_TAG.addEventListener("load", resolve);
  PLOTLY_TAG.addEventListener("error", resolve);
  document.addEventListener("DOMContentLoaded", resolve); // after every deferred script
});

/** The full bundle's load once a plot asked for it (resolves when it is in and the plots drew again), else null. */
export const fullPlotlyLoad = () => fullPlotly;

/** Run ``redraw`` once the full bundle is in. */
export function onFullPlotly(redraw) {
  redraws.push(redraw);
}

/** Load the full bundle (once); plots drawn by the basic one are cleared, then drawn again by the redraws. */
function loadFullPlotly() {
  if (fullPlotly) return fullPlotly;
  const basic = window.Plotly;
  fullPlotly = new Promise((resolve) => {
    const tag = document.createElement("script");
    tag.src = PLOTLY_TAG.dataset.full;
    tag.addEventListener("load", () => {
      for (const div of document.querySelectorAll(".plot")) {
        if (basic && div._fullLayout) basic.purge(div);
        div.tunerClickBound = false;
      }
      plotlyFull = true;
      for (const redraw of redraws) redraw();
      resolve();
    });
    tag.addEventListener("error", () => resolve()); // the basic plots stay; the others stay empty
    document.head.appendChild(tag);
  });
  return fullPlotly;
}

/** Whether drawing ``data`` waits for the full bundle (and asks for it). */
function needsFullPlotly(data) {
  if (plotlyFull || !data.some((trace) => !BASIC_TRACES.has(trace.type || "scatter"))) return false;
  loadFullPlotly();
  return true;
}

let softwareGL = null;
/** Whether WebGL renders in software here (SwiftShader, llvmpipe: a browser without a GPU) or not at all.
 *  Then the parallel coordinates of a large study (WebGL only) wait to be asked for: software WebGL takes
 *  ten seconds to draw them, whatever their number of lines. WebGL scatter plots cost little there. */
export function webglIsSoftware() {
  if (softwareGL !== null) return softwareGL;
  try {
    const gl = document.createElement("canvas").getContext("webgl");
    if (!gl) return (softwareGL = true);
    const info = gl.getExtension("WEBGL_debug_renderer_info");
    const name = String(gl.getParameter(info ? info.UNMASKED_RENDERER_WEBGL : gl.RENDERER));
    const lose = gl.getExtension("WEBGL_lose_context");
    if (lose) lose.loseContext();
    softwareGL = /swiftshader|llvmpipe|softpipe|software|basic render/i.test(name);
  } catch (_) {
    softwareGL = true;
  }
  return softwareGL;
}

/** The scatter trace type for this many points: WebGL for many. */
export const scatterType = (n) => (n > WEBGL_FROM ? "scattergl" : "scatter");

/** Tick and hover labels as plain numbers ("~g": 0.00008, 72.1, 1500), never Plotly's SI suffixes ("80µ" TFLOP/s
 *  reads as a unit); an axis that sets its own format, or a category or date axis, keeps it. */
const PLAIN_NUMBERS = { tickformat: "~g", hoverformat: "~g" };
export function plainTicks(data, layout) {
  const plain = (axis) =>
    axis && (axis.type === "category" || axis.type === "date") ? axis : { ...PLAIN_NUMBERS, ...(axis || {}) };
  const names = new Set(["xaxis", "yaxis"]);
  for (const trace of data) {
    for (const key of ["xaxis", "yaxis"]) {
      if (typeof trace[key] === "string") names.add(`${key}${trace[key].slice(1)}`);
    }
  }
  for (const key of Object.keys(layout)) if (/^[xy]axis\d*$/.test(key)) names.add(key);
  const out = { ...layout };
  for (const name of names) out[name] = plain(layout[name]);
  if (layout.scene) {
    out.scene = { ...layout.scene };
    for (const key of ["xaxis", "yaxis", "zaxis"]) out.scene[key] = plain(layout.scene[key]);
  }
  return out;
}

/** Draw (or update) a plot; keeps zoom across updates (uirevision) and binds click-to-select once. */
export function draw(div, data, layout, onClick) {
  if (!hasPlotly() || needsFullPlotly(data)) return;
  div.classList.remove("empty");
  const base = {
    margin: { l: 64, r: 20, t: 30, b: 56 },
    hovermode: "closest",
    uirevision: div.id,
    font: { family: "system-ui, sans-serif", size: 12 },
    paper_bgcolor: "#fff",
    plot_bgcolor: "#fff",
  };
  window.Plotly.react(div, data, Object.assign(base, plainTicks(data, layout)), PLOT_CONFIG);
  if (onClick && !div.tunerClickBound) {
    div.on("plotly_click", (event) => {
      const point = event && event.points && event.points[0];
      if (point && point.customdata !== undefined && point.customdata !== null) onClick(Number(point.customdata));
    });
    div.tunerClickBound = true;
  }
}

export function clearPlot(div) {
  if (hasPlotly()) window.Plotly.purge(div);
  div.tunerClickBound = false;
  div.classList.add("empty");
}

/** An objective's axis title. SVG axes render HTML (escape); WebGL 3-D axes draw plain text (do not). */
export function axisTitle(objective, plain) {
  const metric = plain ? objective.metric : escapeHtml(objective.metric);
  return { text: `${metric} (${objective.direction === "maximize" ? "max" : "min"} ${arrow(objective.direction)})` };
}
