/* Building the page's elements. Safety rule of every script here: each string that comes from the API
 * (names, params, errors, fingerprints) reaches the DOM through textContent / attributes, or through
 * escapeHtml() when Plotly renders it (hover text, tick labels and axis titles accept a subset of HTML).
 * No markup string is ever parsed into the DOM.
 */

export const $ = (id) => document.getElementById(id);

const HTML_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;" };
/** Escape a user string for Plotly text (hover, ticks, titles, legends), which renders a subset of HTML.
 *  With < and > escaped no tag can form, so quotes are harmless; Plotly would show "&quot;" verbatim. */
export function escapeHtml(value) {
  return String(value).replace(/[&<>]/g, (c) => HTML_ESCAPES[c]);
}

/** Build an element; string children become text nodes, never markup. */
export function h(tag, attrs, ...children) {
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

/** A note paragraph: shown with ``text``, hidden without. */
export function showNote(id, text) {
  const node = $(id);
  if (!node) return;
  node.textContent = text || "";
  node.hidden = !text;
}

/** The top bar's connection line (live, polling, unreachable). */
export function setConnection(text) {
  const node = $("connection");
  if (node) node.textContent = text;
}
