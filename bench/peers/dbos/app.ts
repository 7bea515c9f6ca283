/**
 * DBOS's TypeScript row: the workflow of app.py on the TypeScript
 * SDK, run in this process, on a Postgres system database (the harness
 * gives each round a database of its own).
 */

import { DBOS } from "@dbos-inc/dbos-sdk";
import { check, serve, STEPS } from "../loop.ts";

DBOS.setConfig({ name: "bench", systemDatabaseUrl: process.env.DATABASE!, logLevel: "warn" });

const noop = DBOS.registerStep(async (i: number) => i, { name: "noop" });
const workflow = DBOS.registerWorkflow(
  async (n: number) => {
    for (let i = 0; i < n; i++) await noop(i);
    return n;
  },
  { name: "workflow" },
);

await DBOS.launch();
await serve(async () => check(await workflow(STEPS)), "in process");
await DBOS.shutdown();
