// Signing in: an API key, typed or pasted, exchanged at once for the session
// cookie. The field is emptied before the request is even answered.

import { errorBox, h } from "../dom.js";
import { signIn } from "../session.js";

/**
 * @param {{done: () => Promise<void>}} opts
 * @returns {import("../app.js").Page}
 */
export function page({ done }) {
  const input = h("input", { id: "api-key", name: "api-key", type: "password", autocomplete: "off", spellcheck: "false", required: true,
    placeholder: "rbk_…", "aria-describedby": "key-help" });
  const status = h("div", { class: "form-status" });
  const button = h("button", { type: "submit" }, "Sign in");
  const form = h("form", { class: "signin", onsubmit: (e) => void submit(e) },
    h("label", { for: "api-key" }, "API key"),
    input,
    h("p", { id: "key-help", class: "muted" },
      "An administrator makes one with ", h("code", null, "rebuno keys create --name NAME --role ROLE"),
      ". The key is exchanged for a session cookie and is not stored in this browser."),
    button,
    status);

  /** @param {Event} e */
  async function submit(e) {
    e.preventDefault();
    const key = input.value.trim();
    input.value = "";
    if (!key) return;
    button.disabled = true;
    status.replaceChildren();
    try {
      await signIn(key);
      await done();
    } catch (err) {
      status.replaceChildren(errorBox(err));
      input.focus();
    } finally {
      button.disabled = false;
    }
  }

  queueMicrotask(() => input.focus());
  return { title: "Sign in", node: h("section", { class: "narrow" }, h("h1", null, "Sign in"), form) };
}
