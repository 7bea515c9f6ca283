/**
 * The client of both Restate rows: registers the service's deployment
 * through the admin API, then invokes the handler request-response through
 * the ingress (one HTTP request per invocation, answered with the result).
 * Node's fetch rather than a Python client for the Python service too: an
 * httpx client measured here took twice the CPU per invocation and held
 * the Python row's c50 to two thirds of what the service does.
 */

import { check, serve, STEPS } from "../loop.ts";

const { ADMIN_URL, INGRESS_URL, SERVICE_URL } = process.env as Record<string, string>;

/** Registers the deployment, retrying while restate-server or the service is still starting. */
async function register(): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const answer = await fetch(`${ADMIN_URL}/deployments`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ uri: SERVICE_URL }),
    }).catch((e: unknown) => e as Error);
    if (!(answer instanceof Error) && answer.ok) return;
    if (Date.now() > deadline) {
      throw new Error(`registering ${SERVICE_URL}: ${answer instanceof Error ? answer.message : await answer.text()}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

await register();
await serve(async () => {
  const answer = await fetch(`${INGRESS_URL}/Bench/run`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(STEPS),
  });
  if (!answer.ok) throw new Error(`invocation: ${answer.status} ${await answer.text()}`);
  check(await answer.json());
}, "request-response");
