/* The study page's trial table: the server sorts, filters and pages it; the page shown answers a click at
 * once (sorted and filtered here too), the server's page follows. */
import { $, h, setConnection } from "./dom.js";
import { getJSON } from "./api.js";
import { firstLine, fmtDuration, fmtValue } from "./format.js";
import { S, TABLE_PAGE, actions, base, frontNumbers, metricNames, objectives, paramNames } from "./state.js";

/** The table's sort as the API names it ("number" for a column the server does not sort: the page shown sorts it). */
function serverSort() {
  const key = S.sort.key;
  let name = null;
  if (key === "number" || key === "status") name = key;
  else if (key.startsWith("m:")) name = key.slice(2);
  if (name === null) return "number";
  return S.sort.dir < 0 ? `-${name}` : name;
}

/** The query of a table page from ``offset``: sort, page size and the status filter. */
export function tableQuery(offset) {
  const params = new URLSearchParams({ sort: serverSort(), limit: TABLE_PAGE, offset });
  if (S.filter) params.set("status", S.filter);
  return params;
}

export async function loadTable() {
  S.table = await getJSON(`${base}/trials?${tableQuery(S.tableOffset)}`);
}

function tableColumns() {
  const objs = new Set(objectives().map((o) => o.metric));
  const cols = [
    { key: "number", label: "#", get: (t) => t.number, num: true },
    { key: "status", label: "status", get: (t) => t.status },
  ];
  for (const m of metricNames())
    cols.push({
      key: `m:${m}`,
      label: m,
      title: objs.has(m) ? "objective" : "metric",
      get: (t) => t.metrics[m],
      num: true,
    });
  for (const p of paramNames())
    cols.push({ key: `p:${p}`, label: p, title: "parameter", get: (t) => (t.params || {})[p] });
  cols.push(
    { key: "worker", label: "worker", get: (t) => t.worker },
    { key: "duration_s", label: "duration", get: (t) => t.duration_s, num: true, fmt: fmtDuration },
    { key: "error", label: "error", get: (t) => firstLine(t.error) },
  );
  return cols;
}

function compareValues(a, b) {
  const aMissing = a === null || a === undefined;
  const bMissing = b === null || b === undefined;
  if (aMissing || bMissing) return aMissing === bMissing ? 0 : aMissing ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

/** Counts by status as the filter offers them (copies are "ok" trials; the summary counts them apart). */
function statusCounts() {
  const counts = Object.assign({}, (S.study && S.study.counts) || {});
  if (counts.duplicate) counts.ok = (counts.ok || 0) + counts.duplicate;
  delete counts.duplicate;
  return counts;
}

/** Change the table's query: the rows at hand at once, then the server's page. */
function changeTable(update) {
  update();
  renderTable();
  loadTable()
    .then(renderTable)
    .catch((error) => setConnection(`API unreachable (${error.message}); retrying`));
}

function renderHead(table, cols) {
  table.tHead.rows[0].replaceChildren(
    ...cols.map((c) => {
      const th = h("th", { "data-key": c.key, title: c.title || null, scope: "col" }, c.label);
      if (c.key === S.sort.key) th.classList.add(S.sort.dir > 0 ? "sorted-asc" : "sorted-desc");
      th.addEventListener("click", () => {
        const next = S.sort.key === c.key ? { key: c.key, dir: -S.sort.dir } : { key: c.key, dir: 1 };
        const before = serverSort();
        S.sort = next;
        if (serverSort() !== before || next.key === "number") changeTable(() => (S.tableOffset = 0));
        else renderTable(); // a column the server does not sort: this page sorts in the browser
      });
      return th;
    }),
  );
}

function renderFilter() {
  const filter = $("trial-status-filter");
  const counts = statusCounts();
  if (S.filter && !counts[S.filter]) counts[S.filter] = 0;
  const all = S.study ? Object.values(counts).reduce((a, b) => a + b, 0) : S.table.total;
  filter.replaceChildren(
    h("option", { value: "" }, `all (${all})`),
    ...Object.keys(counts)
      .sort()
      .map((s) => h("option", { value: s }, `${s} (${counts[s]})`)),
  );
  filter.value = S.filter;
}

/** The status cell: the status, and what marks the trial (a copy, on the front, a violated constraint). */
function statusCell(t, front) {
  const td = h("td", {});
  const kind = t.status === "ok" || t.status === "running" || t.status === "infeasible_static" ? t.status : "failure";
  td.appendChild(h("span", { class: `status-text-${kind}` }, t.status));
  if (t.duplicate_of !== null && t.duplicate_of !== undefined)
    td.appendChild(h("span", { class: "muted" }, ` (duplicate of #${t.duplicate_of})`));
  else if (front.has(t.number)) td.appendChild(h("span", { title: "on the Pareto front" }, " ★"));
  else if (t.feasible === false && t.status === "ok")
    td.appendChild(h("span", { class: "muted" }, " (constraint violated)"));
  return td;
}

function tableRow(t, cols, front) {
  const tr = h("tr", { class: "clickable", "data-trial": t.number });
  if (t.number === S.selected) tr.classList.add("selected");
  for (const c of cols) {
    if (c.key === "status") {
      tr.appendChild(statusCell(t, front));
      continue;
    }
    const value = c.get(t);
    const td = h("td", { class: c.num ? "num" : null });
    if (c.key === "error") {
      td.className = "error-cell";
      td.textContent = value || "";
      if (t.error) td.title = t.error;
    } else {
      td.textContent = c.fmt ? c.fmt(value) : fmtValue(value);
    }
    tr.appendChild(td);
  }
  tr.addEventListener("click", () => actions.select(t.number));
  return tr;
}

export function renderTable() {
  const table = $("trial-table");
  const cols = tableColumns();
  if (!cols.some((c) => c.key === S.sort.key)) S.sort = { key: "number", dir: 1 };
  renderHead(table, cols);
  renderFilter();
  const col = cols.find((c) => c.key === S.sort.key);
  // The page shown is sorted and filtered here too: a click answers at once, the server's page follows.
  const rows = (S.table.items || []).filter((t) => !S.filter || t.status === S.filter);
  const missing = (v) => v === null || v === undefined;
  rows.sort((a, b) => {
    const byValue = compareValues(col.get(a), col.get(b));
    return (missing(col.get(a)) || missing(col.get(b)) ? byValue : S.sort.dir * byValue) || a.number - b.number;
  });
  const front = frontNumbers();
  table.tBodies[0].replaceChildren(...rows.map((t) => tableRow(t, cols, front)));
  renderPager(rows.length);
}

function renderPager(shown) {
  const total = S.table.total || 0;
  const first = shown ? S.tableOffset + 1 : 0;
  $("trial-count").textContent =
    total > shown ? `trials ${first}–${S.tableOffset + shown} of ${total}` : `${total} trials`;
  const pager = $("trial-pager");
  if (!pager) return;
  pager.hidden = total <= TABLE_PAGE;
  $("trial-prev").disabled = S.tableOffset <= 0;
  $("trial-next").disabled = S.tableOffset + TABLE_PAGE >= total;
}

/** Mark the selected trial's row. */
export function markSelectedRow(number) {
  for (const tr of $("trial-table").tBodies[0].rows)
    tr.classList.toggle("selected", Number(tr.dataset.trial) === number);
}

/** The status filter and the pager's buttons. */
export function bindTableControls() {
  $("trial-status-filter").addEventListener("change", (event) =>
    changeTable(() => {
      S.filter = event.target.value;
      S.tableOffset = 0;
    }),
  );
  $("trial-prev").addEventListener("click", () =>
    changeTable(() => (S.tableOffset = Math.max(0, S.tableOffset - TABLE_PAGE))),
  );
  $("trial-next").addEventListener("click", () => changeTable(() => (S.tableOffset += TABLE_PAGE)));
}
