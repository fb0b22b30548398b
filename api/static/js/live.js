/* The study page's live updates while the study runs: the server's event stream (the trials that changed and
 * the study), or polling where the stream cannot run (a token: EventSource sends no Authorization header),
 * with a slow backup refresh that covers a stream gone quiet. */
import { $, setConnection } from "./dom.js";
import { ROOT, askForToken, getJSON, storedToken } from "./api.js";
import { TERMINAL } from "./format.js";
import { renderHeader } from "./header.js";
import { POLL_MS, S, actions, base, isTerminal, paretoPath } from "./state.js";
import { loadTable } from "./table.js";

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
      actions.renderAll();
    } catch (_) {
      /* the backup refresh catches up */
    }
  }, 1000);
}

/** Decide what live updates should run now: stop at a terminal status, start while running. */
export function afterStudyUpdate() {
  if (isTerminal()) {
    if (S.live) {
      stopLive();
      actions.refresh(true); // the last trials and importances of the finished study
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
    if (!fromStream || TERMINAL.has(study.status)) actions.refresh(TERMINAL.has(study.status));
  }
}

/** A listener of one kind of event: its JSON body to ``handle``; a malformed event is left to the backup poll. */
const onEvent = (handle) => (event) => {
  try {
    handle(JSON.parse(event.data));
  } catch (_) {
    /* a malformed event: the backup poll catches up */
  }
};

function startStream() {
  // From the sequence the page was drawn at: the stream sends only what changed since.
  const source = new EventSource(`${ROOT}${base}/events?after=${S.seq}`);
  S.events = source;
  source.addEventListener("open", () => setConnection("live (server events)"));
  source.addEventListener(
    "trials",
    onEvent((body) => {
      mergeTrials(body.trials || []);
      S.seq = Math.max(S.seq, body.seq || 0);
      scheduleLightRefresh();
    }),
  );
  source.addEventListener(
    "study",
    onEvent((study) => onStudyEvent(study, true)),
  );
  source.addEventListener("error", () => {
    if (S.events !== source) return;
    source.close(); // the stream ended or never worked: poll instead
    S.events = null;
    if (S.live) startPolling();
  });
  // A slow light refresh covers a stream that goes quiet.
  S.backupTimer = setInterval(scheduleLightRefresh, 10 * POLL_MS);
}

function startLive() {
  S.live = true;
  $("live-indicator").hidden = false;
  // EventSource cannot send an Authorization header: with a token the page polls instead.
  if (window.EventSource && !storedToken()) startStream();
  else startPolling();
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
        askForToken(() => actions.refresh(true));
        return;
      }
      setConnection(`API unreachable (${error.message}); retrying`);
    }
    if (S.live) S.pollTimer = setTimeout(tick, POLL_MS);
  };
  S.pollTimer = setTimeout(tick, POLL_MS);
}

export function stopLive() {
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
