// Building the page. Everything shown comes from the kernel, and much of it
// from agents and models (tool arguments and results, LLM text, names,
// reasons): it is only ever put into the page as text nodes, never parsed as
// HTML: no script of the console parses text as markup (a Go test checks).

/** @typedef {Node | string | number | null | undefined | false | Child[]} Child */
/** @typedef {Record<string, string | number | boolean | null | undefined | EventListener>} Attrs */

/**
 * Makes an element. Attributes named on* are event listeners; a false, null
 * or undefined attribute or child is left out; strings become text.
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs | null} [attrs]
 * @param {...Child} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/**
 * Appends children as nodes or text.
 * @param {Element} el
 * @param {Child[]} children
 */
export function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/**
 * Replaces an element's content.
 * @param {Element} el
 * @param {...Child} children
 */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/**
 * A link inside the console.
 * @param {string} href a path under /ui/
 * @param {...Child} children
 */
export function link(href, ...children) {
  return h("a", { href }, ...children);
}

/**
 * The status word exactly as the API spells it, coloured by its meaning.
 * @param {string} status
 */
export function badge(status) {
  return h("span", { class: `badge status-${/^[a-z_]+$/.test(status) ? status : "other"}` }, status);
}

/**
 * A message that something failed, with the API's words.
 * @param {unknown} err
 */
export function errorBox(err) {
  return h("p", { class: "error", role: "alert" }, err instanceof Error ? err.message : String(err));
}
