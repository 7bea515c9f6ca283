/**
 * The agent the console tests drive: one TypeScript SDK agent whose input
 * names a scenario. Tools that must wait for the test ask the test's gate
 * server ($GATE_URL), which answers when the test releases that gate.
 */

import { Agent, defineTool, rebunoFetch, resource } from "rebuno";
import { LocalDirectory } from "rebuno/drivers";

const gateUrl = process.env.GATE_URL!;

/** Waits until the test releases the named gate. */
const waitGate = defineTool({
  name: "wait_gate",
  execute: async ({ name }: { name: string }) => {
    const r = await fetch(`${gateUrl}/wait/${encodeURIComponent(name)}`);
    return `released ${await r.text()}`;
  },
});

const echo = defineTool({ name: "echo", execute: async (args: { n: number; text?: string }) => args });

/** Returns markup: the console must show it as text. */
const markup = defineTool({ name: "render_html", execute: async () => "<img src=x onerror=alert(1)>" });

/** The policy asks a human before every email. */
const sendEmail = defineTool({ name: "send_email", execute: async ({ to }: { to: string; body: string }) => `sent to ${to}` });

type Input = { scenario: string; gate?: string; n?: number; to?: string; llm?: string; pauseMs?: number };

async function run(input: Input) {
  switch (input.scenario) {
    case "gate":
      await echo({ n: 1 });
      await waitGate({ name: input.gate ?? "g" });
      await echo({ n: 2 });
      return { done: true };
    case "email":
      return { sent: await sendEmail({ to: input.to ?? "eve@example.org", body: "Quarterly numbers attached." }) };
    case "markup":
      return { html: await markup({}) };
    case "many":
      for (let i = 0; i < (input.n ?? 10); i++) await echo({ n: i });
      return { steps: input.n };
    case "paced":
      // Steps one at a time with a pause between, after a gate: each step's
      // events reach an open timeline on their own (bench/console).
      await waitGate({ name: input.gate ?? "paced" });
      for (let i = 0; i < (input.n ?? 10); i++) {
        await echo({ n: i });
        await new Promise((r) => setTimeout(r, input.pauseMs ?? 20));
      }
      return { steps: input.n };
    case "workspace": {
      const workspace = await resource("workspace", { driver: new LocalDirectory(), checkpoints: { everySteps: 1 } });
      const write = defineTool({
        name: "write_file",
        resources: ["workspace"],
        execute: async ({ path, content }: { path: string; content: string }) => {
          await workspace.files.write(path, content);
          return `wrote ${path}`;
        },
      });
      await write({ path: "plan.md", content: "1. read\n2. write\n" });
      await write({ path: "notes.md", content: "done" });
      return { files: await workspace.files.list() };
    }
    case "llm": {
      // A streamed chat completion: the console shows its tokens while they come.
      const r = await rebunoFetch(`${input.llm}/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "scripted", stream: true, messages: [{ role: "user", content: "Say hello" }] }),
      });
      return { streamed: (await r.text()).length };
    }
  }
  throw new Error(`unknown scenario ${input.scenario}`);
}

const agent = new Agent(process.env.AGENT_ID!);
await agent.serve({ port: 0 }, run);
console.log(`PORT ${agent.address!.port}`);
