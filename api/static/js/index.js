/* The studies page (the entry module of /): every study with its status, progress, best value and ETA, paged
 * and filtered by the server, polled every two seconds. */
import { $, h, setConnection } from "./dom.js";
import { ROOT, askForToken, getJSON, setUpAuthForm } from "./api.js";
import { TERMINAL, bestText, failedCount, fmtDuration, fmtTime, progressBar, statusBadge } from "./format.js";

const POLL_MS = 2000;
const state = { offset: 0, limit: 50, total: 0, timer: null, chosen: new Set() };

/** The Compare link: enabled with two or more studies ticked, to /compare?studies=... */
function updateCompare() {
  const link = $("compare-link");
  if (!link) return;
  const chosen = [...state.chosen].sort((a, b) => a - b);
  link.href = `${ROOT}/compare?studies=${chosen.join(",")}`;
  link.classList.toggle("disabled", chosen.length < 2);
  link.setAttribute("aria-disabled", String(chosen.length < 2));
}

function tick(study) {
  const box = h("input", { type: "checkbox", class: "compare-pick", "aria-label": `compare study ${study.id}` });
  box.checked = state.chosen.has(study.id);
  box.addEventListener("change", () => {
    if (box.checked) state.chosen.add(study.id);
    else state.chosen.delete(study.id);
    updateCompare();
  });
  return h("td", {}, box);
}

function row(study) {
  const failed = failedCount(study.counts);
  return h(
    "tr",
    { "data-study-id": study.id },
    tick(study),
    h("td", { class: "num" }, study.id),
    h("td", {}, h("a", { href: `${ROOT}/studies/${encodeURIComponent(study.id)}` }, study.name)),
    h("td", {}, study.workload),
    h("td", {}, statusBadge(study.status)),
    h("td", {}, progressBar(study), `${study.measured}/${study.budget_trials}`),
    h("td", {}, bestText(study)),
    h("td", { class: "num" }, failed),
    h("td", { class: "num" }, fmtDuration(study.elapsed_s)),
    h("td", { class: "num" }, TERMINAL.has(study.status) ? "–" : fmtDuration(study.eta_s)),
    h("td", {}, fmtTime(study.updated_at)),
  );
}

async function refresh() {
  clearTimeout(state.timer);
  const params = new URLSearchParams({ limit: state.limit, offset: state.offset });
  const status = $("status-filter").value;
  const workload = $("workload-filter").value.trim();
  if (status) params.set("status", status);
  if (workload) params.set("workload", workload);
  try {
    const page = await getJSON(`/api/studies?${params}`);
    state.total = page.total;
    document.querySelector("#studies-table tbody").replaceChildren(...page.items.map(row));
    $("studies-empty").hidden = page.items.length > 0;
    const first = page.items.length ? page.offset + 1 : 0;
    $("studies-count").textContent = `${first}–${page.offset + page.items.length} of ${page.total}`;
    $("page-prev").disabled = state.offset <= 0;
    $("page-next").disabled = state.offset + page.items.length >= page.total;
    setConnection(`live · updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error.status === 401) {
      setConnection("waiting for the API token");
      askForToken(refresh);
      return; // no polling until a token is entered
    }
    setConnection(`API unreachable (${error.message}); retrying`);
  }
  state.timer = setTimeout(refresh, POLL_MS);
}

function start() {
  setUpAuthForm();
  const fromStart = () => {
    state.offset = 0;
    refresh();
  };
  $("status-filter").addEventListener("change", fromStart);
  $("workload-filter").addEventListener("change", fromStart);
  $("compare-link").addEventListener("click", (event) => {
    if (state.chosen.size < 2) event.preventDefault();
  });
  updateCompare();
  $("page-prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - state.limit);
    refresh();
  });
  $("page-next").addEventListener("click", () => {
    state.offset += state.limit;
    refresh();
  });
  refresh();
}

start();
