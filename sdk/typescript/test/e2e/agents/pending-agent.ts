/**
 * A child-process agent for the carried-outcome crash tests
 * (docs/protocol/steps.md §13). `safeA`'s outcome travels with `onceB`'s
 * submit, `onceB` (at_most_once) reports before it returns, `safeC`'s
 * outcome waits for `safeD`'s submit. With KILL_AFTER naming a step, the
 * process SIGKILLs itself right after that step returns, synchronously, so
 * that no timer or carrier runs in between; RELEASE turns that off. Every
 * body run appends its name to $MARKERS.
 */

import fs from "node:fs";
import { Agent, defineTool } from "../../../src/index.js";

const mark = (name: string): void => fs.appendFileSync(process.env.MARKERS!, `${name}\n`);

const marking = (name: string, idempotency: "safe_to_retry" | "at_most_once" = "safe_to_retry") =>
  defineTool({ name, idempotency, execute: ({ n }: { n: number }) => (mark(name), `${name}:${n}`) });

const safeA = marking("safe_a");
const onceB = marking("once_b", "at_most_once");
const safeC = marking("safe_c");
const safeD = marking("safe_d");

function killAfter(name: string): void {
  if (process.env.KILL_AFTER === name && !process.env.RELEASE) {
    mark("killing");
    process.kill(process.pid, "SIGKILL");
  }
}

const agent = new Agent(process.env.AGENT_ID!);
await agent.serve({ port: Number(process.env.PORT ?? 0) }, async ({ n }: { n: number }) => {
  const a = await safeA({ n });
  const b = await onceB({ n });
  killAfter("once_b");
  const c = await safeC({ n });
  killAfter("safe_c");
  const d = await safeD({ n });
  return { a, b, c, d };
});
console.log(`PORT ${agent.address!.port}`);
