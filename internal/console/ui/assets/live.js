// Live updates over the API's server-sent event streams. The browser's
// EventSource sends the session cookie and resumes a dropped stream with
// Last-Event-ID; a stream the kernel has ended (204, or an error status)
// stays closed.

import { h } from "./dom.js";

/**
 * @typedef {object} Live
 * @property {HTMLElement} indicator shows whether the stream is open
 * @property {() => void} close
 */

/**
 * Follows a stream.
 * @param {string} url
 * @param {{onMessage: (e: MessageEvent<string>) => void, onEnd?: (e: MessageEvent<string>) => void}} handlers
 * @returns {Live}
 */
export function follow(url, handlers) {
  const indicator = h("span", { class: "live", title: "connecting" }, "connecting");
  const source = new EventSource(url);
  const show = (/** @type {string} */ state) => {
    indicator.className = `live live-${state}`;
    indicator.textContent = state;
    indicator.title = state === "live" ? "updates as the kernel commits" : state;
  };
  source.onopen = () => show("live");
  source.onmessage = handlers.onMessage;
  source.addEventListener("end", (e) => {
    source.close();
    show("ended");
    handlers.onEnd?.(/** @type {MessageEvent<string>} */ (e));
  });
  source.onerror = () => show(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  return {
    indicator,
    close: () => {
      source.close();
      show("closed");
    },
  };
}

/**
 * Runs an async task now, or once more after the running one ends: however
 * many requests come while it runs, it runs at most once after.
 * @param {() => Promise<void>} task
 * @returns {() => void}
 */
export function coalesce(task) {
  let running = false;
  let again = false;
  const run = async () => {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      do {
        again = false;
        await task();
      } while (again);
    } finally {
      running = false;
    }
  };
  return () => void run();
}
