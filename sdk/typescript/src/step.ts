/**
 * `step()`: record a piece of local non-determinism (kind `local`).
 *
 *     const started = await step("now", () => Date.now());
 *     const page = await step("fetch_page", () => fetchPage(url), { url });
 *     await step("lint", lint, {}, { resources: ["workspace"] });
 *
 * The first run calls `fn` and records its result; every replay returns the
 * recorded result without calling it. `args` is part of the step's identity
 * (none is recorded as `{}`). A local step no policy rule matches is always
 * allowed; an explicit rule can still deny it, which throws `PolicyError`
 * here (a tool returns a string instead).
 */

import { type Idempotency, runEffect, validateIdempotency, validateResources } from "./effects.js";

export interface StepOptions {
  idempotency?: Idempotency | undefined;
  /** Resource keys the step may change. */
  resources?: readonly string[] | undefined;
}

/**
 * Run `fn()` once per execution and replay its result afterwards. `fn` may
 * be sync or async; its result must be JSON. Throws `ToolError` when `fn`
 * threw (live or on replay), `PolicyError` when denied, `RateLimited` when
 * rate limited.
 */
export async function step<T>(name: string, fn: () => T | Promise<T>, args?: unknown, options?: Idempotency | StepOptions): Promise<Awaited<T>> {
  if (typeof name !== "string" || !name) throw new TypeError("a step name must be a non-empty string");
  if (typeof fn !== "function") throw new TypeError("step() needs a function");
  const opts: StepOptions = typeof options === "string" ? { idempotency: options } : options ?? {};
  const idempotency = validateIdempotency(opts.idempotency ?? "safe_to_retry");
  const resources = validateResources(opts.resources);
  return (await runEffect("local", name, args === undefined || args === null ? {} : args, fn, {
    idempotency, resources, what: `step ${JSON.stringify(name)}`,
  })) as Awaited<T>;
}
