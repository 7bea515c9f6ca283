/** The TypeScript twin of py_writer.py: the same steps with the same identities, on the TypeScript SDK. */

import fs from "node:fs";
import { Agent, defineTool, execution, resource, step } from "../../../src/index.js";
import { LocalDirectory } from "../../../src/drivers/index.js";

const driver = new LocalDirectory();

async function process_(input: { writes: number; every: number; who: string }) {
  const ws = await resource("workspace", { driver, checkpoints: { everySteps: input.every } });
  const opened: Record<string, string> = {};
  for (const name of await ws.files.list()) opened[name] = await ws.files.read(name);
  fs.appendFileSync(process.env.OPENED!, JSON.stringify({ execution: execution().executionId, sdk: "typescript", files: opened }) + "\n");
  const writeFile = defineTool({
    name: "write_file",
    resources: ["workspace"],
    execute: async ({ path, content }: { path: string; content: string }) => (await ws.files.write(path, content), `wrote ${path}`),
  });
  for (let k = 1; k <= input.writes; k++) await writeFile({ path: `f${k}`, content: `${k} by ${input.who}` });
  const listed = await step("list", () => ws.files.list());
  return { files: listed };
}

const agent = new Agent(process.env.AGENT_ID!);
await agent.serve({ port: Number(process.env.PORT) }, process_);
console.log(`PORT ${agent.address!.port}`);
