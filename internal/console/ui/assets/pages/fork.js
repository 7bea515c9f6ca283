// Fork here: first what a fork at this event would restore (the kernel's
// coverage query, which changes nothing), then, once confirmed, the fork.

import { call, seg } from "../api.js";
import { errorBox, fill, h } from "../dom.js";

/**
 * @typedef {object} PointCoverage
 * @property {string} key
 * @property {boolean} covered
 * @property {string} reason covered, no_checkpoint or step_started
 * @property {string} [checkpoint_ref]
 * @property {number} [checkpoint_seq]
 */

const REASONS = {
  covered: "a checkpoint describes its state here",
  no_checkpoint: "no checkpoint was taken before this point",
  step_started: "a step that may change it started after its last checkpoint",
};

/**
 * Opens the fork dialog for one event.
 * @param {{executionId: string, seq: number, go: (path: string) => void}} o
 */
export function openFork({ executionId, seq, go }) {
  const base = `/v0/executions/${seg(executionId)}`;
  const content = h("div", { class: "fork-content" }, h("p", { class: "muted" }, "Reading coverage…"));
  const create = h("button", { type: "button", class: "primary", disabled: true }, "Create fork");
  const cancel = h("button", { type: "button", class: "quiet" }, "Cancel");
  const titleId = `fork-title-${seq}`;
  const dialog = h("dialog", { class: "fork-dialog", "aria-labelledby": titleId },
    h("h2", { id: titleId }, `Fork at event #${seq}`),
    content,
    h("div", { class: "actions" }, create, cancel));
  // One key per dialog: a second click, or a retry after a lost answer,
  // makes no second fork.
  const key = randomKey();
  cancel.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => dialog.remove());
  create.addEventListener("click", async () => {
    create.disabled = true;
    try {
      const { data } = await call("POST", `${base}/fork`, { body: { at_seq: seq }, headers: { "Idempotency-Key": key } });
      dialog.close();
      go(`/ui/executions/${seg(data.id)}`);
    } catch (e) {
      content.append(errorBox(e));
      create.disabled = false;
    }
  });
  document.body.append(dialog);
  dialog.showModal();

  call("GET", `${base}/coverage?at_seq=${seq}`).then(({ data }) => {
    /** @type {PointCoverage[]} */
    const resources = data.resources;
    const verdict = data.covered ? "covered" : "not covered";
    fill(content,
      h("p", { class: `verdict ${data.covered ? "ok" : "warn"}` }, "This point is ", h("strong", { class: "coverage" }, verdict), "."),
      h("p", null, data.covered
        ? "A fork here restores every resource to its state at this event, and the steps up to it replay."
        : "A fork here restores each resource from the newest checkpoint before this event (or its initial environment), which may not be the state it had here; the steps up to it replay."),
      resources.length === 0
        ? h("p", { class: "muted" }, "No resources were registered by this event: there is nothing to restore.")
        : h("table", { class: "list" },
          h("thead", null, h("tr", null, ["Resource", "Coverage", "Why", "Checkpoint restored"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", null, resources.map((r) => h("tr", null,
            h("td", null, h("strong", null, r.key)),
            h("td", null, r.covered ? "covered" : "not covered"),
            h("td", null, REASONS[/** @type {keyof typeof REASONS} */ (r.reason)] ?? r.reason),
            h("td", null, r.checkpoint_ref
              ? [h("code", { class: "checkpoint-ref" }, r.checkpoint_ref), ` (taken at #${r.checkpoint_seq})`]
              : "none: the initial environment"))))),
      h("p", { class: "muted small" }, "Nothing is created until you confirm."));
    create.disabled = false;
    create.focus();
  }, (e) => fill(content, errorBox(e)));
}

/** An Idempotency-Key: 32 hex digits (crypto.randomUUID needs HTTPS or localhost). */
function randomKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
