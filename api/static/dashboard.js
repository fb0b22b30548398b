/* gpu-knob-tuner dashboard: the pages are shells; this script reads the JSON API and draws them.
 *
 * Safety rule: every string that comes from the API (names, params, errors, fingerprints) reaches the
 * DOM through textContent / attributes, or through escapeHtml() when Plotly renders it (hover text,
 * tick labels and axis titles accept a subset of HTML). No markup string is ever parsed into the DOM.
 */
(function () {
  "use strict";

  const ROOT = document.body.dataset.root || "";
  const TERMINAL = new Set(["completed", "stopped", "failed"]);
  const NOT_FAILURES = new Set(["ok", "running", "infeasible_static", "duplicate"]);
  const POLL_MS = 2000;
  const IMPORTANCE_EVERY_MS = 8000;
  const TABLE_PAGE = 100; // trial table rows per page (the server sorts, filters and pages)
  const WEBGL_FROM = 2000; // scatter plots of more points than this draw through WebGL
  const PARCOORDS_MAX = 5000; // parallel coordinates draw the best this many trials
  const PARCOORDS_SOFTWARE = 200; // where WebGL renders in software, more trials than this wait to be asked for
  const FRONT_SAMPLE = 150; // the front's points the page holds: all of them up to this, else a sample as many
  // The trials the plots hold at most (beyond it every k-th, and the front): each SVG point costs draw time.
  const POINTS_SAMPLE = 400;
  const ACCENT = "#d9480f";
  const PLOT_CONFIG = {
    responsive: true,
    displaylogo: false,
    modeBarButtonsToRemove: ["lasso2d", "select2d"],
  };

  // ---------------------------------------------------------------- helpers
  const $ = (id) => document.getElementById(id);

  const HTML_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;" };
  /** Escape a user string for Plotly text (hover, ticks, titles, legends), which renders a subset of HTML.
   *  With < and > escaped no tag can form, so quotes are harmless; Plotly would show "&quot;" verbatim. */
  function escapeHtml(value) {
    return String(value).replace(/[&<>]/g, (c) => HTML_ESCAPES[c]);
  }

  /** Build an element; string children become text nodes, never markup. */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /** Min and max of a long array (Math.min(...a) overflows the stack past ~100k arguments). */
  function minOf(values) {
    let out = Infinity;
    for (const v of values) if (v < out) out = v;
    return out;
  }
  function maxOf(values) {
    let out = -Infinity;
    for (const v of values) if (v > out) out = v;
    return out;
  }

  function isNum(v) {
    return typeof v === "number" && Number.isFinite(v);
  }

  function fmtNum(v) {
    if (!isNum(v)) return "–";
    if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(Number(v.toPrecision(4)));
  }

  function fmtValue(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") return fmtNum(v);
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function fmtDuration(s) {
    if (!isNum(s)) return "–";
    if (s < 60) return `${s.toFixed(1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  }

  function fmtTime(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
  }

  function arrow(direction) {
    return direction === "maximize" ? "↑" : "↓";
  }

  /** A safe file name for the download attribute. */
  function fileStem(name) {
    return String(name || "study")
      .replace(/[^A-Za-z0-9._-]+/g, "_")
      .slice(0, 100);
  }

  // A server bound beyond loopback may need the bearer token for reads too. The page asks for it once
  // (see #auth-form) and keeps it for this tab only (sessionStorage), sending it on every request.
  const TOKEN_KEY = "tuner-api-token";
  function storedToken() {
    try {
      return window.sessionStorage.getItem(TOKEN_KEY) || "";
    } catch (_) {
      return "";
    }
  }
  function authHeaders(extra) {
    const token = storedToken();
    return Object.assign({}, extra || {}, token ? { Authorization: `Bearer ${token}` } : {});
  }
  let onToken = null; // what to run again once a token is entered

  function askForToken(retry) {
    onToken = retry;
    const form = $("auth-form");
    if (!form || !form.hidden) return;
    form.hidden = false;
    $("auth-message").textContent = storedToken()
      ? "The server refused this token. Enter the API token:"
      : "This server needs the API token to read. Enter it:";
    $("auth-token").focus();
  }

  function setUpAuthForm() {
    const form = $("auth-form");
    if (!form) return;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("auth-token").value.trim();
      try {
        if (token) window.sessionStorage.setItem(TOKEN_KEY, token);
        else window.sessionStorage.removeItem(TOKEN_KEY);
      } catch (_) {
        /* storage disabled: the token lasts until the page is left */
      }
      form.hidden = true;
      if (onToken) onToken();
    });
  }

  async function getJSON(path) {
    const response = await fetch(ROOT + path, {
      headers: authHeaders({ accept: "application/json" }),
      cache: "no-store",
    });
    if (!response.ok) {
      const error = new Error(`${response.status} ${response.statusText} for ${path}`);
      error.status = response.status;
      try {
        const body = await response.json();
        if (body && body.detail) error.message = `${response.status}: ${fmtValue(body.detail)}`;
      } catch (_) {
        /* not JSON */
      }
      throw error;
    }
    return response.json();
  }

  /** Links to downloads: native while no token is needed; with a token, fetched and saved from a blob. */
  function downloadLink(attrs, text) {
    return tokenAwareDownload(h("a", attrs, text));
  }

  function tokenAwareDownload(link) {
    link.addEventListener("click", async (event) => {
      if (!storedToken()) return; // the browser downloads it itself
      event.preventDefault();
      const response = await fetch(link.href, { headers: authHeaders() });
      if (!response.ok) {
        setConnection(`export failed: ${response.status}`);
        return;
      }
      const url = URL.createObjectURL(await response.blob());
      const save = h("a", { href: url, download: link.getAttribute("download") || "" });
      document.body.appendChild(save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    });
    return link;
  }

  function setConnection(text) {
    const node = $("connection");
    if (node) node.textContent = text;
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
  function statusBadge(status) {
    const kind = STUDY_OR_TRIAL_STATUSES.has(status) ? status : "failure"; // a trial's failure status
    return h("span", { class: `badge status-${kind}` }, status);
  }

  function failedCount(counts) {
    let n = 0;
    for (const [status, count] of Object.entries(counts || {})) if (!NOT_FAILURES.has(status)) n += count;
    return n;
  }

  function bestText(study) {
    const objective = (study.objectives || [])[0];
    if (!study.best || !objective) return "–";
    return `${objective.metric} ${fmtNum(study.best.metrics[objective.metric])} (trial #${study.best.trial})`;
  }

  function progressBar(study) {
    const bar = h("span", { class: "bar" });
    bar.style.width = `${Math.round(100 * Math.max(0, Math.min(1, study.progress || 0)))}%`;
    if (TERMINAL.has(study.status)) bar.classList.add("done");
    return h("span", { class: "progress" }, bar);
  }

  const hasPlotly = () => typeof window.Plotly !== "undefined";

  // The study page loads Plotly after this script (its first request is under way meanwhile), and the basic
  // bundle first (scatter and bar: a quarter of the full bundle's compile time). A plot that needs another
  // trace type asks for the full bundle (``data-full``); once it is in, every plot is drawn again with it.
  const PLOTLY_TAG = document.getElementById("plotly-script");
  const BASIC_TRACES = new Set(["scatter", "bar", "pie"]);
  let plotlyFull = !(PLOTLY_TAG && PLOTLY_TAG.dataset.full && !/\/plotly\.min\.js$/.test(PLOTLY_TAG.src));
  let fullPlotly = null; // the full bundle's load, once asked for
  const onFullPlotly = []; // what to draw again once the full bundle is in

  /** Resolves once the Plotly script has run (or failed to load): deferred scripts run in order, after this one. */
  const plotlyReady = new Promise((resolve) => {
    if (hasPlotly() || !PLOTLY_TAG || document.readyState === "complete") return resolve();
    PLOTLY_TAG.addEventListener("load", resolve);
    PLOTLY_TAG.addEventListener("error", resolve);
    document.addEventListener("DOMContentLoaded", resolve); // after every deferred script
  });

  /** Load the full bundle (once); plots drawn by the basic one are cleared, then drawn again by onFullPlotly. */
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
        for (const redraw of onFullPlotly) redraw();
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
  function webglIsSoftware() {
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
  const scatterType = (n) => (n > WEBGL_FROM ? "scattergl" : "scatter");

  /** Draw (or update) a plot; keeps zoom across updates (uirevision) and binds click-to-select once. */
  function draw(div, data, layout, onClick) {
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
    window.Plotly.react(div, data, Object.assign(base, layout), PLOT_CONFIG);
    if (onClick && !div.tunerClickBound) {
      div.on("plotly_click", (event) => {
        const point = event && event.points && event.points[0];
        if (point && point.customdata !== undefined && point.customdata !== null) onClick(Number(point.customdata));
      });
      div.tunerClickBound = true;
    }
  }

  function clearPlot(div) {
    if (hasPlotly()) window.Plotly.purge(div);
    div.tunerClickBound = false;
    div.classList.add("empty");
  }

  function showNote(id, text) {
    const node = $(id);
    if (!node) return;
    node.textContent = text || "";
    node.hidden = !text;
  }

  /** An objective's axis title. SVG axes render HTML (escape); WebGL 3-D axes draw plain text (do not). */
  function axisTitle(objective, plain) {
    const metric = plain ? objective.metric : escapeHtml(objective.metric);
    return { text: `${metric} (${objective.direction === "maximize" ? "max" : "min"} ${arrow(objective.direction)})` };
  }

  // ---------------------------------------------------------------- studies page
  function indexPage() {
    const state = { offset: 0, limit: 50, total: 0, timer: null };
    const tbody = document.querySelector("#studies-table tbody");

    function row(study) {
      const failed = failedCount(study.counts);
      return h(
        "tr",
        { "data-study-id": study.id },
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
        tbody.replaceChildren(...page.items.map(row));
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

    $("status-filter").addEventListener("change", () => {
      state.offset = 0;
      refresh();
    });
    $("workload-filter").addEventListener("change", () => {
      state.offset = 0;
      refresh();
    });
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

  // ---------------------------------------------------------------- study page
  function studyPage() {
    const studyId = Number(document.body.dataset.studyId);
    const base = `/api/studies/${studyId}`;
    const S = {
      study: null,
      trials: [], // every trial as the plots draw it (params, metrics, status; no samples, no error text)
      table: { items: [], total: 0 }, // the trial table's current page, as GET /trials answers it
      tableOffset: 0,
      failures: [], // the latest failed, statically infeasible and constraint-violating trials, with their errors
      stride: 1, // the plots hold every trial (1), or every stride-th trial and the whole front
      seq: 0, // the study's change sequence the data above stands at (events go on from it)
      lightTimer: null,
      pareto: null, // the front as /pareto answers it: whole, or sampled along it (a large front) until asked for
      frontAll: false, // the whole front was asked for: refreshes fetch all of it
      parallelAll: false, // parallel coordinates were asked for (software WebGL draws a large study's on request)
      importances: null,
      importanceError: null,
      importanceAt: 0,
      selected: null,
      selectedDetail: null,
      sort: { key: "number", dir: 1 },
      filter: "",
      openFailures: new Set(),
      events: null,
      pollTimer: null,
      backupTimer: null,
      refreshing: null,
      refreshAgain: false,
      live: false,
      stamp: "",
      refreshes: 0,
      clock: null, // the last answer's elapsed time and ETA, and when it came (performance.now())
    };
    window.tunerDashboard = { state: S, refresh: () => refreshData(true) };

    const objectives = () => (S.study && S.study.objectives) || [];
    const isTerminal = () => S.study && TERMINAL.has(S.study.status);
    const hasAll = (t, objs) => objs.every((o) => isNum(t.metrics[o.metric]));
    const feasibleOk = (t) => t.status === "ok" && t.feasible === true && t.duplicate_of == null;
    const violated = (t) => t.status === "ok" && t.feasible === false && t.duplicate_of == null;
    const frontNumbers = () => new Set(((S.pareto && S.pareto.trials) || []).map((t) => t.number));
    const spaceParams = () => (S.study && S.study.space && S.study.space.params) || {};

    function paramNames() {
      const names = Object.keys(spaceParams());
      for (const t of S.trials) for (const k of Object.keys(t.params || {})) if (!names.includes(k)) names.push(k);
      return names;
    }

    function metricNames() {
      const names = objectives().map((o) => o.metric);
      const rest = new Set();
      for (const t of S.trials) for (const k of Object.keys(t.metrics || {})) if (!names.includes(k)) rest.add(k);
      return names.concat([...rest].sort());
    }

    /** Hover text of a trial: objectives then params, every user string escaped. */
    function hoverText(t, extraMetrics) {
      const lines = [`<b>trial #${t.number}</b>`];
      const shown = objectives()
        .map((o) => o.metric)
        .concat(extraMetrics || []);
      for (const m of shown)
        if (m in (t.metrics || {})) lines.push(`${escapeHtml(m)}: ${escapeHtml(fmtNum(t.metrics[m]))}`);
      const params = Object.entries(t.params || {});
      for (const [k, v] of params.slice(0, 16)) lines.push(`${escapeHtml(k)} = ${escapeHtml(fmtValue(v))}`);
      if (params.length > 16) lines.push(`… ${params.length - 16} more`);
      return lines.join("<br>");
    }

    // ------------------------------------------------------------ data
    /** The table's sort as the API names it, or null for a column the server does not sort (that one sorts the page shown). */
    function serverSort() {
      const key = S.sort.key;
      let name = null;
      if (key === "number" || key === "status") name = key;
      else if (key.startsWith("m:")) name = key.slice(2);
      if (name === null) return "number";
      return S.sort.dir < 0 ? `-${name}` : name;
    }

    function tableQuery(offset) {
      const params = new URLSearchParams({ sort: serverSort(), limit: TABLE_PAGE, offset });
      if (S.filter) params.set("status", S.filter);
      return params;
    }

    async function loadTable() {
      S.table = await getJSON(`${base}/trials?${tableQuery(S.tableOffset)}`);
    }

    /** Merge changed trials (from the event stream) into the plot points, by number. */
    function mergeTrials(changed) {
      const index = new Map(S.trials.map((t, i) => [t.number, i]));
      for (const t of changed) {
        if (index.has(t.number)) S.trials[index.get(t.number)] = t;
        else {
          index.set(t.number, S.trials.length);
          S.trials.push(t);
        }
      }
      S.trials.sort((a, b) => a.number - b.number);
    }

    /** After changes arrive: the front and the table page again (both small), then redraw; at most once a second. */
    function scheduleLightRefresh() {
      if (S.lightTimer) return;
      S.lightTimer = setTimeout(async () => {
        S.lightTimer = null;
        try {
          const [pareto] = await Promise.all([getJSON(paretoPath()), loadTable()]);
          S.pareto = pareto;
          renderAll();
        } catch (_) {
          /* the backup refresh catches up */
        }
      }, 1000);
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

    /** Fetch the study, its trials, front and importances, then redraw. One at a time; calls during one queue one more. */
    function refreshData(force) {
      if (S.refreshing) {
        S.refreshAgain = true;
        return S.refreshing;
      }
      S.refreshing = (async () => {
        try {
          // One request for the first draw: study, first table page, plot points, front, failures.
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
          if (fullPlotly) await fullPlotly; // a plot waits for the full bundle: drawn once it is in
          S.refreshes += 1;
          document.body.dataset.refreshes = String(S.refreshes);
          // Importances (Optuna's evaluator over the study) come after the first draw, never before it.
          const forceImportances = force || TERMINAL.has(S.study.status);
          loadImportances(forceImportances).then(renderImportance, () => {});
          if (!S.live) setConnection(`updated ${new Date().toLocaleTimeString()}`);
        } catch (error) {
          if (error.status === 404) {
            showError(`There is no study ${studyId}.`);
            stopLive();
          } else if (error.status === 401) {
            stopLive();
            setConnection("waiting for the API token");
            askForToken(() => refreshData(true));
            return;
          } else {
            setConnection(`API unreachable (${error.message}); retrying`);
            if (!S.study) setTimeout(() => refreshData(true), POLL_MS); // nothing loaded yet: keep trying
          }
        } finally {
          S.refreshing = null;
        }
        if (S.refreshAgain) {
          S.refreshAgain = false;
          setTimeout(() => refreshData(false), 500);
        }
        if (S.study) afterStudyUpdate();
      })();
      return S.refreshing;
    }

    function showError(text) {
      const node = $("load-error");
      node.textContent = text;
      node.hidden = false;
    }

    /** Decide what live updates should run now: stop at a terminal status, start while running. */
    function afterStudyUpdate() {
      if (isTerminal()) {
        if (S.live) {
          stopLive();
          refreshData(true); // the last trials and importances of the finished study
        }
        setConnection(`study ${S.study.status}; not updating`);
      } else if (!S.live) {
        startLive();
      }
    }

    function onStudyEvent(study, fromStream) {
      const stamp = `${study.status}|${study.updated_at}|${study.measured}|${JSON.stringify(study.counts)}`;
      S.study = Object.assign({}, S.study || {}, study);
      renderHeader();
      if (TERMINAL.has(study.status) && S.events) {
        S.events.close(); // the server ends the stream now; do not let EventSource reconnect
        S.events = null;
      }
      if (stamp !== S.stamp) {
        S.stamp = stamp;
        // The stream brings the trials themselves; a poll (or the end of the study) reloads.
        if (!fromStream || TERMINAL.has(study.status)) refreshData(TERMINAL.has(study.status));
      }
    }

    function startLive() {
      S.live = true;
      $("live-indicator").hidden = false;
      if (window.EventSource && !storedToken()) {
        // EventSource cannot send an Authorization header: with a token the page polls instead.
        // From the sequence the page was drawn at: the stream sends only what changed since.
        const source = new EventSource(`${ROOT}${base}/events?after=${S.seq}`);
        S.events = source;
        source.addEventListener("open", () => setConnection("live (server events)"));
        source.addEventListener("trials", (event) => {
          try {
            const body = JSON.parse(event.data);
            mergeTrials(body.trials || []);
            S.seq = Math.max(S.seq, body.seq || 0);
            scheduleLightRefresh();
          } catch (_) {
            /* a malformed event: the backup poll catches up */
          }
        });
        source.addEventListener("study", (event) => {
          try {
            onStudyEvent(JSON.parse(event.data), true);
          } catch (_) {
            /* a malformed event: the backup poll catches up */
          }
        });
        source.addEventListener("error", () => {
          if (S.events !== source) return;
          source.close(); // the stream ended or never worked: poll instead
          S.events = null;
          if (S.live) startPolling();
        });
        // A slow light refresh covers a stream that goes quiet.
        S.backupTimer = setInterval(scheduleLightRefresh, 10 * POLL_MS);
      } else {
        startPolling();
      }
    }

    function startPolling() {
      if (S.pollTimer) return;
      setConnection(`live (polling every ${POLL_MS / 1000} s)`);
      const tick = async () => {
        try {
          const study = await getJSON(base);
          onStudyEvent(study);
        } catch (error) {
          if (error.status === 401) {
            stopLive();
            askForToken(() => refreshData(true));
            return;
          }
          setConnection(`API unreachable (${error.message}); retrying`);
        }
        if (S.live) S.pollTimer = setTimeout(tick, POLL_MS);
      };
      S.pollTimer = setTimeout(tick, POLL_MS);
    }

    function stopLive() {
      S.live = false;
      $("live-indicator").hidden = true;
      if (S.events) S.events.close();
      S.events = null;
      clearTimeout(S.pollTimer);
      clearInterval(S.backupTimer);
      clearTimeout(S.lightTimer);
      S.lightTimer = null;
      S.pollTimer = null;
      S.backupTimer = null;
    }

    // ------------------------------------------------------------ rendering
    /** Redraw everything; the milliseconds each part took are kept in ``tunerDashboard.renderMs``. */
    function renderAll() {
      window.tunerDashboard.renderMs = {};
      renderParts(textParts().concat(plotParts()));
    }

    /** The parts that draw no plot; the plots (and the selected trial, which marks them). */
    const textParts = () => [renderHeader, renderTable, renderFailures, renderFingerprint];
    const plotParts = () =>
      [renderPareto, renderHistory, renderParallel, renderImportance, renderRoofline].concat(
        S.selected !== null ? [renderSelected] : [],
      );

    function renderParts(parts) {
      const times = window.tunerDashboard.renderMs || {};
      for (const part of parts) {
        const start = performance.now();
        part();
        times[part.name] = Math.round(performance.now() - start);
      }
      window.tunerDashboard.renderMs = times;
    }
    onFullPlotly.push(() => renderParts(plotParts()));

    function renderHeader() {
      const study = S.study;
      if (!study) return;
      document.title = `${study.name} · gpu-knob-tuner`;
      $("study-name").textContent = study.name;
      $("study-workload").textContent = study.workload;
      const status = $("study-status");
      status.textContent = study.status;
      status.className = `badge status-${String(study.status).replace(/[^a-z_]/g, "")}`;
      document.body.dataset.studyStatus = study.status;
      $("study-objectives").textContent = objectives()
        .map((o) => `${o.metric} ${arrow(o.direction)}`)
        .join(", ");
      const bar = $("study-progress-bar");
      bar.style.width = `${Math.round(100 * Math.max(0, Math.min(1, study.progress || 0)))}%`;
      bar.classList.toggle("done", TERMINAL.has(study.status));
      const counts = study.counts || {};
      const running = study.running !== undefined ? study.running : counts.running || 0;
      const extras = [];
      if (running) extras.push(`${running} running`);
      if (failedCount(counts)) extras.push(`${failedCount(counts)} failed`);
      if (counts.infeasible_static) extras.push(`${counts.infeasible_static} statically infeasible, not run`);
      if (counts.duplicate) extras.push(`${counts.duplicate} duplicates, not run`);
      $("study-progress-text").textContent =
        `${study.measured}/${study.budget_trials} measured` + (extras.length ? ` (${extras.join(", ")})` : "");
      S.clock = { at: performance.now(), elapsed: study.elapsed_s, eta: study.eta_s, status: study.status };
      tickClock();
      const best = $("study-best");
      best.replaceChildren();
      if (study.best) {
        best.appendChild(
          h(
            "a",
            { href: `#trial-${study.best.trial}`, onclick: (e) => (e.preventDefault(), selectTrial(study.best.trial)) },
            bestText(study),
          ),
        );
      } else {
        best.textContent = "–";
      }
      const message = $("study-message");
      message.textContent = study.message || "";
      message.hidden = !study.message;
      // proposals the sampler replaced inside its proposal step (not trial rows)
      const proposals = $("study-proposals");
      const replaced = study.proposals || null;
      proposals.hidden = !replaced;
      proposals.textContent = replaced
        ? `replaced proposals: ${replaced.repeats_replaced || 0} duplicates, ` +
          `${replaced.static_rejected || 0} statically infeasible (not trials)`
        : "";
      const stem = fileStem(study.name);
      for (const fmt of ["json", "yaml"]) {
        const link = $(`export-best-${fmt}`);
        link.href = `${ROOT}${base}/export?format=${fmt}`;
        link.setAttribute("download", `${stem}-best.${fmt}`);
        link.classList.toggle("disabled", !study.best);
      }
      $("stop-button").hidden = TERMINAL.has(study.status) || study.status === "stopping";
      $("resume-button").hidden = !TERMINAL.has(study.status) || study.status === "completed";
      $("timing-note").hidden = !S.trials.some((t) => t.status === "ok" && t.timing_comparable === false);
    }

    /** The front as the page holds it: the whole front, or a sample spread along it (``total`` its size). */
    const frontShown = () => ((S.pareto && S.pareto.trials) || []).length;
    const frontTotal = () => (S.pareto && S.pareto.total !== undefined ? S.pareto.total : frontShown());
    const paretoPath = () => `${base}/pareto?${S.frontAll ? "all=true" : `sample=${FRONT_SAMPLE}`}`;

    // Elapsed time and ETA move on between the server's answers: from the last answer, one tick a second.
    function tickClock() {
      const c = S.clock;
      if (!c) return;
      const live = c.status === "running" || c.status === "stopping";
      const since = live ? (performance.now() - c.at) / 1000 : 0;
      $("study-elapsed").textContent = fmtDuration(isNum(c.elapsed) ? c.elapsed + since : c.elapsed);
      $("study-eta").textContent =
        TERMINAL.has(c.status) || !isNum(c.eta) ? "–" : fmtDuration(Math.max(0, c.eta - since));
    }
    window.setInterval(tickClock, 1000);

    /** What the plots leave out of a very large study (the server bounds the points of the first draw). */
    function sampledNote() {
      if (!S.study) return "";
      const parts = [];
      const trials = S.study.counts ? Object.values(S.study.counts).reduce((a, b) => a + b, 0) : "the";
      if (S.stride > 1) parts.push(`every ${S.stride}th of ${trials} trials`);
      if (frontTotal() > frontShown())
        parts.push(`${frontShown()} of the front's ${frontTotal()} points, spread along it (every ${S.pareto.stride}th)`);
      else if (S.stride > 1) parts.push("the whole front");
      return parts.length ? ` Plots show ${parts.join(" and ")}.` : "";
    }

    /** Fetch the whole front (on request: a large front is sampled on load) and redraw. */
    async function loadWholeFront() {
      S.frontAll = true;
      try {
        S.pareto = await getJSON(paretoPath());
        renderAll();
      } catch (error) {
        setConnection(`could not load the whole front (${error.message})`);
      }
    }

    function renderPareto() {
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
      const pick = S.pareto ? S.pareto.default_pick : null;
      const pickTrial = front.find((t) => t.number === pick) || points.find((t) => t.number === pick);
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
          h("button", { type: "button", id: "whole-front", onclick: loadWholeFront }, `Load all ${frontTotal()} front points`),
        );
      const three = used.length === 3;
      $("pareto-title").textContent = three ? "Pareto front (3 objectives)" : "Pareto front";
      const coords = (list) => {
        const c = { x: list.map((t) => t.metrics[used[0].metric]), y: list.map((t) => t.metrics[used[1].metric]) };
        if (three) c.z = list.map((t) => t.metrics[used[2].metric]);
        return c;
      };
      const trace = (name, list, style) =>
        Object.assign(
          {
            type: three ? "scatter3d" : scatterType(points.length),
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
      if (front.length > 1 && !three) front.sort((a, b) => a.metrics[used[0].metric] - b.metrics[used[0].metric]);
      const data = [
        trace("trials", points, { marker: { color: "#adb5bd", size: 8 * size, opacity: 0.85 } }),
        trace("constraint violated", bad, {
          marker: { color: "#ffa8a8", size: 8 * size, symbol: three ? "x" : "x-thin-open" },
        }),
        trace("Pareto front", front, {
          mode: three ? "markers" : "lines+markers",
          line: { color: ACCENT, width: 1.5, dash: "dot" },
          marker: { color: ACCENT, size: 11 * size, line: { color: "#fff", width: 1 } },
        }),
        trace("default pick", pickTrial ? [pickTrial] : [], {
          marker: {
            color: "#f59f00",
            size: 18 * size,
            symbol: three ? "diamond" : "star",
            line: { color: "#7a4a00", width: 1 },
          },
        }),
        trace("selected", selected ? [selected] : [], {
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
      const layout = three
        ? {
            scene: {
              xaxis: { title: axisTitle(used[0], true) },
              yaxis: { title: axisTitle(used[1], true) },
              zaxis: { title: axisTitle(used[2], true) },
              camera: { eye: { x: 1.7, y: 1.7, z: 1.1 } },
            },
            margin: { l: 0, r: 0, t: 30, b: 0 },
            legend: { orientation: "h", y: 1.08 },
          }
        : {
            xaxis: { title: axisTitle(used[0]), zeroline: false },
            yaxis: { title: axisTitle(used[1]), zeroline: false },
            legend: { orientation: "h", y: 1.12 },
          };
      draw(div, data, layout, selectTrial);
    }

    function renderHistory() {
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
      const bestX = [];
      const bestY = [];
      let best = null;
      for (const t of feasible) {
        const v = t.metrics[metric];
        if (best === null || better(v, best)) best = v;
        bestX.push(t.number);
        bestY.push(best);
      }
      if (bestX.length && S.trials.length) {
        const last = maxOf(S.trials.map((t) => t.number));
        if (last > bestX[bestX.length - 1]) {
          bestX.push(last);
          bestY.push(best);
        }
      }
      const selected = feasible.concat(bad).find((t) => t.number === S.selected);
      const kind = scatterType(done.length);
      const data = [
        {
          type: kind,
          mode: "markers",
          name: escapeHtml(metric), // legend text is HTML too
          x: feasible.map((t) => t.number),
          y: feasible.map((t) => t.metrics[metric]),
          customdata: feasible.map((t) => t.number),
          hovertext: feasible.map((t) => hoverText(t)),
          hoverinfo: "text",
          marker: { color: "#4c6ef5", size: 7 },
        },
        {
          type: kind,
          mode: "markers",
          name: "constraint violated",
          x: bad.map((t) => t.number),
          y: bad.map((t) => t.metrics[metric]),
          customdata: bad.map((t) => t.number),
          hovertext: bad.map((t) => hoverText(t)),
          hoverinfo: "text",
          marker: { color: "#ffa8a8", size: 8, symbol: "x-thin-open" },
        },
        {
          type: "scatter",
          mode: "lines",
          name: "best so far",
          x: bestX,
          y: bestY,
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
      draw(
        div,
        data,
        {
          xaxis: { title: { text: "trial number" }, zeroline: false },
          yaxis: { title: axisTitle(objective), zeroline: false },
          legend: { orientation: "h", y: 1.12 },
        },
        selectTrial,
      );
    }

    function niceTicks(lo, hi, count) {
      if (lo === hi) return [lo];
      const step = (hi - lo) / (count - 1);
      return Array.from({ length: count }, (_, i) => lo + i * step);
    }

    /** One parcoords dimension per param: numbers as they are (pow2 on a log2 axis), categories as indices.
     *  Plotly renders a dimension's label as HTML (escaped here) but its tick text as plain text (not escaped). */
    function dimension(name, values) {
      const spec = spaceParams()[name] || {};
      const present = values.filter((v) => v !== undefined && v !== null);
      const missing = present.length < values.length;
      const label = escapeHtml(name);
      const numeric = present.length > 0 && present.every((v) => isNum(v)) && spec.type !== "categorical";
      if (numeric) {
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
      const categories = (spec.choices || []).map(String);
      for (const v of present) if (!categories.includes(String(v))) categories.push(String(v));
      if (missing) categories.push("n/a");
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

    function renderParallel() {
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
      if (webglIsSoftware() && !S.parallelAll && trials.length > PARCOORDS_SOFTWARE) {
        clearPlot(div);
        showNote(
          "parallel-note",
          `WebGL renders in software in this browser: parallel coordinates of ${trials.length} trials would take ` +
            "about ten seconds, so they are drawn on request. ",
        );
        $("parallel-note").append(
          h("button", { type: "button", id: "draw-parallel", onclick: () => ((S.parallelAll = true), renderParallel()) },
            "Draw parallel coordinates"),
        );
        return;
      }
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

    function renderImportance() {
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

    /** Roofline: needs trials with arithmetic_intensity (FLOP/byte) and tflops, and device.roofline peaks. */
    function renderRoofline() {
      const div = $("roofline-plot");
      const study = S.study;
      const roof = (study.device && study.device.roofline) || (study.fingerprint && study.fingerprint.roofline) || null;
      const tflopsOf = (t) => (isNum(t.metrics.tflops) ? t.metrics.tflops : t.metrics.achieved_tflops);
      const points = S.trials.filter(
        (t) =>
          t.status === "ok" &&
          isNum(t.metrics.arithmetic_intensity) &&
          t.metrics.arithmetic_intensity > 0 &&
          isNum(tflopsOf(t)) &&
          tflopsOf(t) > 0,
      );
      if (
        !roof ||
        !isNum(roof.peak_tflops) ||
        !isNum(roof.bandwidth_gbps) ||
        roof.peak_tflops <= 0 ||
        roof.bandwidth_gbps <= 0 ||
        !points.length
      ) {
        showNote(
          "roofline-note",
          "This workload reports no roofline data (it needs arithmetic_intensity and tflops per trial, and the device's peak TFLOP/s and bandwidth).",
        );
        clearPlot(div);
        return;
      }
      showNote("roofline-note", "");
      const bw = roof.bandwidth_gbps;
      // One roof per precision the trials used when the device gives peaks by precision.
      const used = new Set(points.map((t) => String((t.params || {}).precision)));
      let peaks = [];
      if (roof.peaks_tflops && typeof roof.peaks_tflops === "object") {
        peaks = Object.entries(roof.peaks_tflops).filter(([name, v]) => isNum(v) && v > 0 && used.has(name));
      }
      if (!peaks.length) peaks = [["peak", roof.peak_tflops]];
      const ai = points.map((t) => t.metrics.arithmetic_intensity);
      const ridges = peaks.map(([, peak]) => (peak * 1000) / bw); // FLOP/byte where bandwidth stops limiting
      const lo = Math.min(minOf(ai), ...ridges) / 4;
      const hi = Math.max(maxOf(ai), ...ridges) * 4;
      const roofs = peaks.map(([name, peak], i) => {
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
      draw(
        div,
        [
          ...roofs,
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
        selectTrial,
      );
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

    function firstLine(text) {
      if (!text) return null;
      const lines = String(text)
        .trim()
        .split("\n")
        .filter((l) => l.trim());
      return lines.length ? lines[lines.length - 1].slice(0, 300) : null;
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

    function changeTable(update) {
      update();
      renderTable(); // the rows at hand at once, then the server's page
      loadTable()
        .then(renderTable)
        .catch((error) => setConnection(`API unreachable (${error.message}); retrying`));
    }

    function renderTable() {
      const table = $("trial-table");
      const cols = tableColumns();
      if (!cols.some((c) => c.key === S.sort.key)) S.sort = { key: "number", dir: 1 };
      const headRow = table.tHead.rows[0];
      headRow.replaceChildren(
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

      const col = cols.find((c) => c.key === S.sort.key);
      // The page shown is sorted and filtered here too: a click answers at once, the server's page follows.
      const rows = (S.table.items || []).filter((t) => !S.filter || t.status === S.filter);
      rows.sort((a, b) => {
        const byValue = compareValues(col.get(a), col.get(b));
        const missing =
          col.get(a) === null || col.get(a) === undefined || col.get(b) === null || col.get(b) === undefined;
        return (missing ? byValue : S.sort.dir * byValue) || a.number - b.number;
      });
      const front = frontNumbers();
      table.tBodies[0].replaceChildren(
        ...rows.map((t) => {
          const tr = h("tr", { class: "clickable", "data-trial": t.number });
          if (t.number === S.selected) tr.classList.add("selected");
          for (const c of cols) {
            const value = c.get(t);
            const td = h("td", { class: c.num ? "num" : null });
            if (c.key === "status") {
              const kind =
                t.status === "ok" || t.status === "running" || t.status === "infeasible_static" ? t.status : "failure";
              td.appendChild(h("span", { class: `status-text-${kind}` }, t.status));
              if (t.duplicate_of !== null && t.duplicate_of !== undefined)
                td.appendChild(h("span", { class: "muted" }, ` (duplicate of #${t.duplicate_of})`));
              else if (front.has(t.number)) td.appendChild(h("span", { title: "on the Pareto front" }, " ★"));
              else if (t.feasible === false && t.status === "ok")
                td.appendChild(h("span", { class: "muted" }, " (constraint violated)"));
            } else if (c.key === "error") {
              td.className = "error-cell";
              td.textContent = value || "";
              if (t.error) td.title = t.error;
            } else {
              td.textContent = c.fmt ? c.fmt(value) : fmtValue(value);
            }
            tr.appendChild(td);
          }
          tr.addEventListener("click", () => selectTrial(t.number));
          return tr;
        }),
      );
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

    /** A failure group's size: the summary's count of that status (the page holds the latest 500 failures). */
    function groupSize(status, trials) {
      const counts = (S.study && S.study.counts) || {};
      return Math.max(trials.length, counts[status] || 0);
    }

    function renderFailures() {
      const root = $("failures");
      const counts = (S.study && S.study.counts) || {};
      const nodes = [];
      const summary = Object.entries(counts)
        .sort((a, b) => b[1] - a[1])
        .map(([status, n]) => `${status} ${n}`)
        .join(" · ");
      nodes.push(h("p", {}, summary || "No trials yet."));
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
      for (const [status, trials] of [...groups.entries()].sort((a, b) => b[1].length - a[1].length)) {
        const byError = new Map();
        for (const t of trials) {
          const key =
            firstLine(t.error) ||
            (status === "constraint violated" ? "a constraint of the spec does not hold" : "(no error text)");
          if (!byError.has(key)) byError.set(key, []);
          byError.get(key).push(t);
        }
        const details = h(
          "details",
          { "data-status": status },
          h("summary", {}, `${status}: ${groupSize(status, trials)} trial${groupSize(status, trials) === 1 ? "" : "s"}`),
          ...[...byError.entries()].map(([, list]) => {
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
        details.addEventListener("toggle", () =>
          details.open ? S.openFailures.add(status) : S.openFailures.delete(status),
        );
        nodes.push(details);
      }
      root.replaceChildren(...nodes);
    }

    function renderFingerprint() {
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
      root.replaceChildren(
        h("dl", { class: "fingerprint" }, ...entries.map(([k, v]) => [h("dt", {}, k), h("dd", {}, show(v))])),
      );
      if (study.space_hash) root.appendChild(h("p", { class: "muted small" }, `space hash ${study.space_hash}`));
    }

    // ------------------------------------------------------------ selection
    function selectTrial(number) {
      if (!Number.isInteger(number)) return;
      S.selected = number;
      S.selectedDetail = null;
      if (window.history && history.replaceState) history.replaceState(null, "", `#trial-${number}`);
      renderSelected();
      renderPareto();
      renderHistory();
      for (const tr of $("trial-table").tBodies[0].rows)
        tr.classList.toggle("selected", Number(tr.dataset.trial) === number);
      getJSON(`${base}/trials/${number}`)
        .then((detail) => {
          if (S.selected !== number) return;
          S.selectedDetail = detail;
          renderSelected();
        })
        .catch(() => {
          /* the list's copy of the trial is shown */
        });
    }

    function kvTable(entries) {
      return h(
        "table",
        { class: "kv" },
        h("tbody", {}, ...entries.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))),
      );
    }

    function renderSelected() {
      const panel = $("selected-trial");
      const number = S.selected;
      const listed =
        (S.table.items || []).find((t) => t.number === number) ||
        S.failures.find((t) => t.number === number) ||
        S.trials.find((t) => t.number === number);
      const trial = S.selectedDetail && S.selectedDetail.number === number ? S.selectedDetail : listed;
      panel.dataset.trial = number === null ? "" : String(number);
      if (!trial) {
        panel.replaceChildren(h("p", { class: "muted" }, `Trial #${number} is not in this study (yet).`));
        return;
      }
      const front = frontNumbers();
      const pick = S.pareto ? S.pareto.default_pick : null;
      const objs = new Set(objectives().map((o) => o.metric));
      const metricEntries = Object.entries(trial.metrics || {}).sort(
        (a, b) => Number(objs.has(b[0])) - Number(objs.has(a[0])),
      );
      const info = [
        ["worker", fmtValue(trial.worker)],
        ["attempt", fmtValue(trial.attempt)],
        ["duration", fmtDuration(trial.duration_s)],
        ["finished", fmtTime(trial.finished_at)],
        ["feasible", fmtValue(trial.feasible)],
        ["timing comparable", fmtValue(trial.timing_comparable)],
      ];
      if (trial.duplicate_of !== null && trial.duplicate_of !== undefined)
        info.push(["duplicate of", `#${trial.duplicate_of}`]);
      if (Array.isArray(trial.samples_ms) && trial.samples_ms.length) {
        const sorted = [...trial.samples_ms].sort((a, b) => a - b);
        const median = sorted[Math.floor((sorted.length - 1) / 2)];
        info.push([
          "samples (ms)",
          `${sorted.length}: median ${fmtNum(median)}, min ${fmtNum(sorted[0])}, max ${fmtNum(sorted[sorted.length - 1])}`,
        ]);
      }
      const timing = trial.extra && trial.extra.timing;
      if (timing && Array.isArray(timing.ci95_ms) && timing.ci95_ms.length === 2) {
        info.push([
          "median 95% interval (ms)",
          `${fmtNum(timing.ci95_ms[0])} – ${fmtNum(timing.ci95_ms[1])} over ${fmtValue(timing.reps)} reps`,
        ]);
      }
      if (timing && timing.converged !== undefined && timing.converged !== null)
        info.push(["timing converged", `${fmtValue(timing.converged)} (±${fmtNum(100 * (timing.rel_ci ?? NaN))}%)`]);
      if (timing && timing.mode) info.push(["timing mode", fmtValue(timing.mode)]);
      const extraEntries = Object.entries(trial.extra || {}).filter(([k]) => k !== "timing");
      const title = h("h3", { id: "selected-trial-title" }, `Trial #${trial.number} `, statusBadge(trial.status));
      if (front.has(trial.number))
        title.appendChild(h("span", { class: "muted" }, trial.number === pick ? " ★ default pick" : " ★ Pareto front"));

      const stem = `${fileStem(S.study && S.study.name)}-trial-${trial.number}`;
      const exportUrl = (fmt) => `${ROOT}${base}/export?format=${fmt}&trial=${trial.number}`;
      const exportable = trial.status === "ok";
      const exports = exportable
        ? h(
            "div",
            { class: "actions", id: "export-links" },
            h("span", { class: "label" }, "export"),
            downloadLink(
              { id: "export-link", class: "button primary", href: exportUrl("json"), download: `${stem}.json` },
              "Export JSON",
            ),
            ...["yaml", "env", "python"].map((fmt) =>
              downloadLink(
                {
                  id: `export-link-${fmt}`,
                  class: "button",
                  href: exportUrl(fmt),
                  download: `${stem}.${fmt === "python" ? "py" : fmt}`,
                },
                fmt,
              ),
            ),
          )
        : h("p", { class: "muted" }, "Only successful trials can be exported.");

      panel.replaceChildren(
        ...[
          title,
          h("h3", {}, "Metrics"),
          metricEntries.length
            ? kvTable(metricEntries.map(([k, v]) => [k, fmtNum(v)]))
            : h("p", { class: "muted" }, "none"),
          h("h3", {}, "Parameters"),
          kvTable(Object.entries(trial.params || {}).map(([k, v]) => [k, fmtValue(v)])),
          exports,
          kvTable(info),
          extraEntries.length
            ? h(
                "details",
                { id: "selected-trial-extra" },
                h("summary", {}, "workload report"),
                kvTable(extraEntries.map(([k, v]) => [k, fmtValue(v)])),
              )
            : null,
          trial.error ? h("details", {}, h("summary", {}, "error"), h("pre", {}, trial.error)) : null,
        ].filter(Boolean),
      );
    }

    // ------------------------------------------------------------ controls
    // The server renders the token box only when it has a token (data-writes-need-token): on a server
    // without one, Stop and Resume send no token; on one with a token, a refusal says so plainly.
    async function control(action) {
      const out = $("control-result");
      const needsToken = document.body.dataset.writesNeedToken === "1";
      const box = $("api-token");
      const token = (box ? box.value.trim() : "") || storedToken();
      if (needsToken && !token) {
        out.textContent = "this server needs its API token (TUNER_API_TOKEN) for stop and resume: enter it first";
        return;
      }
      out.textContent = `${action}: sending...`;
      try {
        const response = await fetch(`${ROOT}${base}/${action}`, {
          method: "POST",
          headers: needsToken ? { Authorization: `Bearer ${token}` } : {},
        });
        let detail = "";
        try {
          const body = await response.json();
          detail = body && body.detail ? fmtValue(body.detail) : "";
        } catch (_) {
          /* no body */
        }
        if (response.status === 401) {
          out.textContent = "the server refused this token (401): it is not the server's TUNER_API_TOKEN";
        } else {
          out.textContent = response.ok ? `${action} requested` : `${response.status} ${detail}`;
        }
      } catch (error) {
        out.textContent = error.message;
      }
      await refreshData(true);
    }

    tokenAwareDownload($("export-best-json"));
    tokenAwareDownload($("export-best-yaml"));
    $("control-form").addEventListener("submit", (event) => event.preventDefault());
    $("stop-button").addEventListener("click", () => control("stop"));
    $("resume-button").addEventListener("click", () => control("resume"));
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

    plotlyReady.then(() => {
      if (!hasPlotly()) showError("Plotly did not load: plots are unavailable, tables still work.");
    });
    refreshData(true).then(() => {
      const match = /^#trial-(\d+)$/.exec(window.location.hash);
      if (match) selectTrial(Number(match[1]));
    });
  }

  // ---------------------------------------------------------------- start
  function start() {
    setUpAuthForm();
    const page = document.body.dataset.page;
    if (page === "index") indexPage();
    else if (page === "study") studyPage();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
