/* The JSON API client of the pages: reads (with the tab's token where the server needs one), token-aware
 * downloads and the study actions. A server bound beyond loopback may need the bearer token for reads too:
 * the page asks for it once (see #auth-form) and keeps it for this tab only (sessionStorage), sending it on
 * every request.
 */
import { $, h, setConnection } from "./dom.js";
import { fmtValue } from "./format.js";

export const ROOT = document.body.dataset.root || "";
const TOKEN_KEY = "tuner-api-token";

export function storedToken() {
  try {
    return window.sessionStorage.getItem(TOKEN_KEY) || "";
  } catch (_) {
    return "";
  }
}

export function authHeaders(extra) {
  const token = storedToken();
  return Object.assign({}, extra || {}, token ? { Authorization: `Bearer ${token}` } : {});
}

let onToken = null; // what to run again once a token is entered

export function askForToken(retry) {
  onToken = retry;
  const form = $("auth-form");
  if (!form || !form.hidden) return;
  form.hidden = false;
  $("auth-message").textContent = storedToken()
    ? "The server refused this token. Enter the API token:"
    : "This server needs the API token to read. Enter it:";
  $("auth-token").focus();
}

export function setUpAuthForm() {
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

/** GET ``ROOT + path`` as JSON; an error carries the HTTP ``status`` and the API's ``detail``. */
export async function getJSON(path) {
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

/** POST to ``ROOT + path`` (a study action), with ``token`` when given: {ok, status, detail}. */
export async function postAction(path, token) {
  const response = await fetch(ROOT + path, {
    method: "POST",
    headers: token ? { Authorization: `Bearer ${token}` } : {},
  });
  let detail = "";
  try {
    const body = await response.json();
    detail = body && body.detail ? fmtValue(body.detail) : "";
  } catch (_) {
    /* no body */
  }
  return { ok: response.ok, status: response.status, detail };
}

/** Links to downloads: native while no token is needed; with a token, fetched and saved from a blob. */
export function downloadLink(attrs, text) {
  return tokenAwareDownload(h("a", attrs, text));
}

export function tokenAwareDownload(link) {
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
