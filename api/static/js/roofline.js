/* The study page's roofline: each trial's TFLOP/s against its arithmetic intensity, under the device's roofs. */
import { $, showNote } from "./dom.js";
import { ACCENT, clearPlot, draw, scatterType } from "./draw.js";
import { isNum, maxOf, minOf } from "./format.js";
import { S, actions, hoverText } from "./state.js";

const tflopsOf = (t) => (isNum(t.metrics.tflops) ? t.metrics.tflops : t.metrics.achieved_tflops);

/** The device's roofline peaks, or null when it gives none usable. */
function deviceRoof(study) {
  const roof = (study.device && study.device.roofline) || (study.fingerprint && study.fingerprint.roofline) || null;
  const usable =
    roof && isNum(roof.peak_tflops) && isNum(roof.bandwidth_gbps) && roof.peak_tflops > 0 && roof.bandwidth_gbps > 0;
  return usable ? roof : null;
}

/** One roof line per precision the trials used when the device gives peaks by precision, else one. */
function roofTraces(roof, points, ai) {
  const bw = roof.bandwidth_gbps;
  const used = new Set(points.map((t) => String((t.params || {}).precision)));
  let peaks = [];
  if (roof.peaks_tflops && typeof roof.peaks_tflops === "object") {
    peaks = Object.entries(roof.peaks_tflops).filter(([name, v]) => isNum(v) && v > 0 && used.has(name));
  }
  if (!peaks.length) peaks = [["peak", roof.peak_tflops]];
  const ridges = peaks.map(([, peak]) => (peak * 1000) / bw); // FLOP/byte where bandwidth stops limiting
  const lo = Math.min(minOf(ai), ...ridges) / 4;
  const hi = Math.max(maxOf(ai), ...ridges) * 4;
  return peaks.map(([name, peak], i) => {
    const roofX = [lo, ridges[i], hi];
    return {
      type: "scatter",
      mode: "lines",
      name: `roof ${name}`,
      x: roofX,
      y: roofX.map((x) => Math.min(peak, (x * bw) / 1000)),
      line: { color: "#495057", width: 1.5, dash: i ? "dot" : "solid" },
      hoverinfo: "x+y+name",
    };
  });
}

/** Roofline: needs trials with arithmetic_intensity (FLOP/byte) and tflops, and device.roofline peaks. */
export function renderRoofline() {
  const div = $("roofline-plot");
  const roof = deviceRoof(S.study);
  const points = S.trials.filter(
    (t) =>
      t.status === "ok" &&
      isNum(t.metrics.arithmetic_intensity) &&
      t.metrics.arithmetic_intensity > 0 &&
      isNum(tflopsOf(t)) &&
      tflopsOf(t) > 0,
  );
  if (!roof || !points.length) {
    showNote(
      "roofline-note",
      "This workload reports no roofline data (it needs arithmetic_intensity and tflops per trial, " +
        "and the device's peak TFLOP/s and bandwidth).",
    );
    clearPlot(div);
    return;
  }
  showNote("roofline-note", "");
  const ai = points.map((t) => t.metrics.arithmetic_intensity);
  draw(
    div,
    [
      ...roofTraces(roof, points, ai),
      {
        type: scatterType(ai.length),
        mode: "markers",
        name: "trials",
        x: ai,
        y: points.map(tflopsOf),
        customdata: points.map((t) => t.number),
        hovertext: points.map((t) => hoverText(t, ["arithmetic_intensity", "tflops"])),
        hoverinfo: "text",
        marker: { color: ACCENT, size: 8 },
      },
    ],
    {
      xaxis: { type: "log", title: { text: "arithmetic intensity (FLOP/byte)" } },
      yaxis: { type: "log", title: { text: "TFLOP/s" } },
      legend: { orientation: "h", y: 1.12 },
    },
    (number) => actions.select(number),
  );
}
