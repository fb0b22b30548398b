/* The study page (the entry module of studies/{id}): loads the study in one request, draws it, and keeps it
 * live while it runs. Every part draws from the state in state.js; this module wires them together and fills
 * in the page's actions (select a trial, reload, redraw). */
import { $, setConnection, showNote } from "./dom.js";
import { askForToken, getJSON, setUpAuthForm } from "./api.js";
import { TERMINAL } from "./format.js";
import { fullPlotlyLoad, hasPlotly, onFullPlotly, plotlyReady } from "./draw.js";
import { renderFailures, renderFingerprint } from "./cards.js";
import { bindHeaderControls, renderHeader, tickClock } from "./header.js";
import { afterStudyUpdate, stopLive } from "./live.js";
import { loadAnalysis } from "./analysis.js";
import { bindNotes, renderStudyNote, showTrialNote } from "./notes.js";
import { renderSelected, selectTrial } from "./panel.js";
import { renderParallel } from "./parallel.js";
import { renderHistory, renderImportance, renderPareto } from "./plots.js";
import { renderRoofline } from "./roofline.js";
import { FRONT_SAMPLE, POINTS_SAMPLE, POLL_MS, S, actions, base, paretoPath, studyId } from "./state.js";
import { bindTableControls, loadTable, renderTable, tableQuery } from "./table.js";

const IMPORTANCE_EVERY_MS = 8000;

/** The parts that draw no plot; the plots (and the selected trial, which marks them). */
const textParts = () => [renderHeader, renderTable, renderFailures, renderFingerprint];
const plotParts = () =>
  [renderPareto, renderHistory, renderParallel, renderImportance, renderRoofline].concat(
    S.selected !== null ? [renderSelected] : [],
  );

/** Draw ``parts``; the milliseconds each took are kept in ``tunerDashboard.renderMs``, by its name. */
function renderParts(parts) {
  const times = window.tunerDashboard.renderMs || {};
  for (const part of parts) {
    const start = performance.now();
    part();
    times[part.name] = Math.round(performance.now() - start);
  }
  window.tunerDashboard.renderMs = times;
}

/** Redraw everything. */
function renderAll() {
  window.tunerDashboard.renderMs = {};
  renderParts(textParts().concat(plotParts()));
}

async function loadImportances(force) {
  const now = Date.now();
  if (!force && S.importances !== null && now - S.importanceAt < IMPORTANCE_EVERY_MS) return;
  S.importanceAt = now;
  try {
    const body = await getJSON(`${base}/importance`);
    S.importances = body.importances || {};
    S.importanceError = null;
  } catch (error) {
    S.importances = S.importances || {};
    S.importanceError = error.message;
  }
}

function showError(text) {
  showNote("load-error", text);
}

/** One request for the first draw (study, first table page, plot points, front, failures), then the draw. */
async function loadAndDraw(force) {
  const query = tableQuery(0);
  query.set("points", POINTS_SAMPLE);
  query.set("front", FRONT_SAMPLE);
  const overview = await getJSON(`${base}/overview?${query}`);
  S.study = overview.study;
  S.trials = overview.points;
  S.stride = overview.points_stride || 1;
  S.pareto = S.frontAll ? await getJSON(paretoPath()) : overview.pareto;
  S.failures = overview.failures;
  S.seq = overview.seq;
  if (S.tableOffset) await loadTable();
  else S.table = overview.trials;
  $("load-error").hidden = true;
  window.tunerDashboard.renderMs = {};
  renderParts(textParts()); // the header and the table first: they need no Plotly
  await plotlyReady;
  renderParts(plotParts());
  renderStudyNote(S.study);
  loadAnalysis(force, S.study); // each analysis plot from its own endpoint, after the first draw
  if (fullPlotlyLoad()) await fullPlotlyLoad(); // a plot waits for the full bundle: drawn once it is in
  S.refreshes += 1;
  document.body.dataset.refreshes = String(S.refreshes);
  // Importances (Optuna's evaluator over the study) come after the first draw, never before it.
  loadImportances(force || TERMINAL.has(S.study.status)).then(renderImportance, () => {});
  if (!S.live) setConnection(`updated ${new Date().toLocaleTimeString()}`);
}

/** What a failed load does: a missing study says so, a refused read asks for the token, else retry. */
function loadFailed(error) {
  if (error.status === 404) {
    showError(`There is no study ${studyId}.`);
    stopLive();
  } else if (error.status === 401) {
    stopLive();
    setConnection("waiting for the API token");
    askForToken(() => refreshData(true));
    return false;
  } else {
    setConnection(`API unreachable (${error.message}); retrying`);
    if (!S.study) setTimeout(() => refreshData(true), POLL_MS); // nothing loaded yet: keep trying
  }
  return true;
}

/** Fetch the study, its trials, front and importances, then redraw. One at a time; calls during one queue one more. */
function refreshData(force) {
  if (S.refreshing) {
    S.refreshAgain = true;
    return S.refreshing;
  }
  S.refreshing = (async () => {
    let goOn = true;
    try {
      await loadAndDraw(force);
    } catch (error) {
      goOn = loadFailed(error);
    } finally {
      S.refreshing = null;
    }
    if (!goOn) return; // waiting for the token: no more until it is entered
    if (S.refreshAgain) {
      S.refreshAgain = false;
      setTimeout(() => refreshData(false), 500);
    }
    if (S.study) afterStudyUpdate();
  })();
  return S.refreshing;
}

function start() {
  setUpAuthForm();
  actions.select = (number) => {
    selectTrial(number);
    showTrialNote(number);
  };
  actions.refresh = refreshData;
  actions.renderAll = renderAll;
  window.tunerDashboard = { state: S, refresh: () => refreshData(true) };
  onFullPlotly(() => renderParts(plotParts()));
  window.setInterval(tickClock, 1000);
  bindHeaderControls();
  bindTableControls();
  bindNotes();
  plotlyReady.then(() => {
    if (!hasPlotly()) showError("Plotly did not load: plots are unavailable, tables still work.");
  });
  refreshData(true).then(() => {
    const match = /^#trial-(\d+)$/.exec(window.location.hash);
    if (match) actions.select(Number(match[1]));
  });
}

start();
