/**
 * Where the SDK's log lines go. Defaults to the console, with `debug` and
 * `info` silent unless `REBUNO_LOG` is `debug` or `info`; replace it with
 * `setLogger()` to route them elsewhere.
 */

export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string, error?: unknown): void;
}

const LEVELS = ["debug", "info", "warn", "error"] as const;

function consoleLogger(): Logger {
  const threshold = Math.max(0, LEVELS.indexOf((process.env.REBUNO_LOG ?? "warn") as (typeof LEVELS)[number]));
  const at = (level: number, write: (m: string) => void) => (m: string) => { if (level >= threshold) write(m); };
  return {
    debug: at(0, (m) => console.debug(m)),
    info: at(1, (m) => console.info(m)),
    warn: at(2, (m) => console.warn(m)),
    error: (m, e) => (e === undefined ? console.error(m) : console.error(m, e)),
  };
}

let current: Logger = consoleLogger();

/** The SDK's logger (a proxy, so that `setLogger` applies everywhere at once). */
export const log: Logger = {
  debug: (m) => current.debug(m),
  info: (m) => current.info(m),
  warn: (m) => current.warn(m),
  error: (m, e) => current.error(m, e),
};

/** Route the SDK's log lines to `logger`; without one, back to the console. */
export function setLogger(logger?: Logger): void {
  current = logger ?? consoleLogger();
}
