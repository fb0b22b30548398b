/* The study page's failures card (the latest failures grouped by status, then by error) and its hardware and
 * software card (the fingerprint and the device). */
import { $, h } from "./dom.js";
import { NOT_FAILURES, firstLine, fmtValue } from "./format.js";
import { S, violated } from "./state.js";

/** A failure group's size: the summary's count of that status (the page holds the latest 500 failures). */
function groupSize(status, trials) {
  const counts = (S.study && S.study.counts) || {};
  return Math.max(trials.length, counts[status] || 0);
}

/** The card's first line: the failed trials by status, largest first; trials that did not fail are not named. */
function failureSummary(counts) {
  const entries = Object.entries(counts);
  if (!entries.some(([, n]) => n)) return "No trials yet.";
  const failed = entries.filter(([status, n]) => n && !NOT_FAILURES.has(status)).sort((a, b) => b[1] - a[1]);
  return failed.length ? failed.map(([status, n]) => `${status} ${n}`).join(" · ") : "No failed trials.";
}

/** The trials the card lists, by group: each failure status, statically infeasible, constraint violated. */
function failureGroups() {
  const groups = new Map();
  for (const t of S.failures) {
    let status = null;
    if (!NOT_FAILURES.has(t.status) && t.duplicate_of == null) status = t.status;
    else if (t.status === "infeasible_static") status = "infeasible_static";
    else if (violated(t)) status = "constraint violated";
    if (!status) continue;
    if (!groups.has(status)) groups.set(status, []);
    groups.get(status).push(t);
  }
  return [...groups.entries()].sort((a, b) => b[1].length - a[1].length);
}

/** One group, its trials by error text; open as the user left it. */
function groupDetails(status, trials) {
  const byError = new Map();
  for (const t of trials) {
    const none = status === "constraint violated" ? "a constraint of the spec does not hold" : "(no error text)";
    const key = firstLine(t.error) || none;
    if (!byError.has(key)) byError.set(key, []);
    byError.get(key).push(t);
  }
  const size = groupSize(status, trials);
  const details = h(
    "details",
    { "data-status": status },
    h("summary", {}, `${status}: ${size} trial${size === 1 ? "" : "s"}`),
    ...[...byError.values()].map((list) => {
      const numbers = list.map((t) => `#${t.number}`);
      return h(
        "div",
        { class: "error-group" },
        h(
          "div",
          { class: "muted" },
          `${list.length} × trials ${numbers.slice(0, 30).join(", ")}${numbers.length > 30 ? ", …" : ""}`,
        ),
        h("pre", {}, list[0].error || "(no error text)"),
      );
    }),
  );
  details.open = S.openFailures.has(status);
  details.addEventListener("toggle", () => (details.open ? S.openFailures.add(status) : S.openFailures.delete(status)));
  return details;
}

export function renderFailures() {
  const counts = (S.study && S.study.counts) || {};
  const nodes = [h("p", {}, failureSummary(counts))];
  for (const [status, trials] of failureGroups()) nodes.push(groupDetails(status, trials));
  $("failures").replaceChildren(...nodes);
}

export function renderFingerprint() {
  const root = $("fingerprint");
  const study = S.study;
  const entries = [];
  for (const [k, v] of Object.entries(study.fingerprint || {})) entries.push([k, v]);
  for (const [k, v] of Object.entries(study.device || {})) entries.push([`device.${k}`, v]);
  if (!entries.length) {
    root.replaceChildren(h("p", { class: "muted" }, "Not known until a worker has started."));
    return;
  }
  const show = (v) => (Array.isArray(v) ? v.map(fmtValue).join(", ") || "–" : fmtValue(v));
  const fp = study.fingerprint || {};
  // A replayed study's measurements were taken on the recorded machine; device.* answered the trials here.
  const replayed = fp.replayed
    ? [h("p", { class: "replayed" }, `${fp.measured || "replayed"}; the device below only answered the trials.`)]
    : [];
  root.replaceChildren(
    ...replayed,
    h("dl", { class: "fingerprint" }, ...entries.map(([k, v]) => [h("dt", {}, k), h("dd", {}, show(v))])),
  );
  if (study.space_hash) root.appendChild(h("p", { class: "muted small" }, `space hash ${study.space_hash}`));
}
