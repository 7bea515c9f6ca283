/**
 * A child-process agent for the crash tests. Every body run appends its name
 * to $MARKERS, so the test can tell which bodies ran. The `slow` tool holds
 * forever on its first run (the test kills the process there), and a
 * `workspace` resource (LocalDirectory under $REBUNO_LOCAL_RESOURCES)
 * records the writes.
 */

import fs from "node:fs";
import { Agent, defineTool, resource, step } from "../../../src/index.js";
import { LocalDirectory } from "../../../src/drivers/index.js";

const mark = (name: string): void => fs.appendFileSync(process.env.MARKERS!, `${name}\n`);
const runsOf = (name: string): number => fs.existsSync(process.env.MARKERS!) ? fs.readFileSync(process.env.MARKERS!, "utf8").split("\n").filter((l) => l === name).length : 0;

const driver = new LocalDirectory();

async function process_(input: { n: number }) {
  const workspace = await resource("workspace", { driver, checkpoints: { everySteps: 1 } });
  const write = defineTool({
    name: "write_file",
    resources: ["workspace"],
    execute: async ({ path, content }: { path: string; content: string }) => {
      mark(`write:${path}`);
      await workspace.files.write(path, content);
      if (path === "slow.txt" && runsOf("write:slow.txt") === 1) await new Promise(() => undefined); // killed here
      return `wrote ${path}`;
    },
  });
  const token = await step("token", () => (mark("token"), `t-${input.n}`));
  await write({ path: "a.txt", content: token });
  await write({ path: "slow.txt", content: "slow" });
  await write({ path: "b.txt", content: "after" });
  return { token, files: await workspace.files.list() };
}

const agent = new Agent(process.env.AGENT_ID!);
await agent.serve({ port: Number(process.env.PORT ?? 0) }, process_);
console.log(`PORT ${agent.address!.port}`);
