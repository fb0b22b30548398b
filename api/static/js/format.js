/* How the pages write numbers, durations, times and statuses. */
import { h } from "./dom.js";

export const TERMINAL = new Set(["completed", "stopped", "failed"]);
/** Trial statuses that are not failures (copies and statically rejected configs ran nothing). */
export const NOT_FAILURES = new Set(["ok", "running", "infeasible_static", "duplicate"]);

/** The export formats of a study's default pick and of a trial: the query's name, the label, the file's suffix. */
export const EXPORT_FORMATS = [
  { format: "json", label: "JSON", suffix: "json" },
  { format: "yaml", label: "YAML", suffix: "yaml" },
  { format: "env", label: "env", suffix: "env" },
  { format: "python", label: "Python", suffix: "py" },
];

export function isNum(v) {
  return typeof v === "number" && Number.isFinite(v);
}

/** Min and max of a long array (Math.min(...a) overflows the stack past ~100k arguments). */
export function minOf(values) {
  let out = Infinity;
  for (const v of values) if (v < out) out = v;
  return out;
}
export function maxOf(values) {
  let out = -Infinity;
  for (const v of values) if (v > out) out = v;
  return out;
}

export function fmtNum(v) {
  if (!isNum(v)) return "–";
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
  return String(Number(v.toPrecision(4)));
}

export function fmtValue(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return fmtNum(v);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

export function fmtDuration(s) {
  if (!isNum(s)) return "–";
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

export function arrow(direction) {
  return direction === "maximize" ? "↑" : "↓";
}

/** A safe file name for the download attribute. */
export function fileStem(name) {
  return String(name || "study")
    .replace(/[^A-Za-z0-9._-]+/g, "_")
    .slice(0, 100);
}

/** The last non-blank line of an error text (a traceback's exception), at most 300 characters. */
export function firstLine(text) {
  if (!text) return null;
  const lines = String(text)
    .trim()
    .split("\n")
    .filter((l) => l.trim());
  return lines.length ? lines[lines.length - 1].slice(0, 300) : null;
}

const STUDY_OR_TRIAL_STATUSES = new Set([
  "queued",
  "running",
  "stopping",
  "completed",
  "stopped",
  "failed",
  "ok",
  "infeasible_static",
]);
export function statusBadge(status) {
  const kind = STUDY_OR_TRIAL_STATUSES.has(status) ? status : "failure"; // a trial's failure status
  return h("span", { class: `badge status-${kind}` }, status);
}

export function failedCount(counts) {
  let n = 0;
  for (const [status, count] of Object.entries(counts || {})) if (!NOT_FAILURES.has(status)) n += count;
  return n;
}

export function bestText(study) {
  const objective = (study.objectives || [])[0];
  if (!study.best || !objective) return "–";
  return `${objective.metric} ${fmtNum(study.best.metrics[objective.metric])} (trial #${study.best.trial})`;
}

export function progressBar(study) {
  const bar = h("span", { class: "bar" });
  bar.style.width = `${Math.round(100 * Math.max(0, Math.min(1, study.progress || 0)))}%`;
  if (TERMINAL.has(study.status)) bar.classList.add("done");
  return h("span", { class: "progress" }, bar);
}
