/**
 * The agent of `make demo-ts`: a small coding agent that edits files in a
 * workspace, on the TypeScript SDK (the same story as examples/python/demo).
 *
 * The workspace is a *resource*: a directory made by the SDK's
 * `LocalDirectory` driver. `resource()` creates it on the first dispatch
 * (and takes a baseline checkpoint), opens the same directory again on every
 * later dispatch, and in a fork restores it from the checkpoint the kernel
 * names. `write_file` declares that it changes the workspace, so with
 * `{ everySteps: 1 }` each write is followed by a checkpoint; `read_file` and
 * `read_files` do not declare it. The handler:
 *
 *     1. write_file app.py = print("hello")          → checkpoint
 *     2. read_file  app.py                            (a live step: coverage ends)
 *     3. write_file VERSION = 1.0.0                   → held for approval by policy.yaml
 *     4. write_file app.py = print("hello, world")    → checkpoint
 *     5. read_files                                   → the completion checkpoint follows
 *
 * and returns what the workspace holds. If the release is denied it skips step 4.
 *
 *     export REBUNO_AGENT_SECRET=dev-secret-0123456789
 *     export REBUNO_LOCAL_RESOURCES=/tmp/rebuno-workspaces
 *     npx tsx demo/agent.ts --listen 127.0.0.1:5000
 *     rebuno agent add --id coder --webhook-url http://127.0.0.1:5000/webhook \
 *         --policy-file examples/typescript/demo/policy.yaml
 *     rebuno exec create coder '{"release": "1.0.0"}' --watch
 *
 * The demo (examples/demo) starts it with `--kernel`, `--listen`, `--id` and
 * `--secret`, and reads the lines it prints ("<execution> <what happened>")
 * to tell which steps ran and which replayed.
 */

import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { Agent, Blocked, defineTool, execution, resource } from "rebuno";
import { LocalDirectory, type LocalDirectoryHandle } from "rebuno/drivers";

const { values: args } = parseArgs({
  options: {
    kernel: { type: "string", default: process.env.REBUNO_URL ?? "http://127.0.0.1:8080" },
    listen: { type: "string", default: "127.0.0.1:5000" },
    id: { type: "string", default: "coder" },
    secret: { type: "string", default: process.env.REBUNO_AGENT_SECRET },
    "step-delay": { type: "string", default: "0.4" },
  },
});
const DELAY_MS = Number(args["step-delay"]) * 1000; // how long each write pretends to work

const HELLO = 'print("hello")\n';
const HELLO_WORLD = 'print("hello, world")\n';

// One driver for the whole process; its root is $REBUNO_LOCAL_RESOURCES.
const driver = new LocalDirectory();

// Only for the demo's narration: every body counts its runs here, so that the
// handler can tell a step that ran from one that replayed.
let runs = 0;

/** The workspace's handle: the first call in a dispatch registers, creates or opens it; later calls return the same handle. */
const workspace = (): Promise<LocalDirectoryHandle> => resource("workspace", { driver, checkpoints: { everySteps: 1 } });

const writeFile = defineTool({
  name: "write_file",
  resources: ["workspace"],
  execute: async ({ path, content }: { path: string; content: string }) => {
    runs++;
    const ws = await workspace();
    await sleep(DELAY_MS);
    await ws.files.write(path, content);
    return `wrote ${path}`;
  },
});

const readFile = defineTool({
  name: "read_file",
  execute: async ({ path }: { path: string }) => {
    runs++;
    const ws = await workspace();
    await sleep(DELAY_MS / 4);
    return ws.files.read(path);
  },
});

const readFiles = defineTool({
  name: "read_files",
  execute: async () => {
    runs++;
    const ws = await workspace();
    const out: Record<string, string> = {};
    for (const name of await ws.files.list("/")) out[name] = await ws.files.read(name);
    return out;
  },
});

function say(what: string): void {
  console.log(`${execution().executionId.slice(-8)} ${what}`);
}

/** Awaits one step and says whether its body ran, its result replayed, or the policy held or denied it. */
async function narrate<T>(target: string, shown: Record<string, unknown>, call: () => Promise<T>): Promise<T> {
  const before = runs;
  let result: T;
  try {
    result = await call();
  } catch (e) {
    if (e instanceof Blocked) say(`  blocked ${target} ${JSON.stringify(shown)}: waiting for approval`);
    throw e;
  }
  const how = typeof result === "string" && result.startsWith(`Tool '${target}' was denied`) ? "denied " : runs > before ? "run    " : "replay ";
  say(`  ${how} ${target} ${JSON.stringify(shown)}`);
  return result;
}

/** Write a program, publish a release (with approval), then improve the program. */
async function edit(input: { release?: string }) {
  const release = input.release ?? "1.0.0";
  const ctx = execution();
  say(`attempt ${ctx.dispatchAttempt} of dispatch ${ctx.dispatchId.slice(-8)}`);
  say(`  workspace ${(await workspace()).path}`);

  await narrate("write_file", { path: "app.py" }, () => writeFile({ path: "app.py", content: HELLO }));
  await narrate("read_file", { path: "app.py" }, () => readFile({ path: "app.py" }));
  const answer = await narrate("write_file", { path: "VERSION" }, () => writeFile({ path: "VERSION", content: `${release}\n` }));
  const released = answer === "wrote VERSION";
  if (released) await narrate("write_file", { path: "app.py" }, () => writeFile({ path: "app.py", content: HELLO_WORLD }));
  const files = await narrate("read_files", {}, () => readFiles({}));
  return { released, files };
}

const [host, port] = [args.listen.slice(0, args.listen.lastIndexOf(":")), Number(args.listen.slice(args.listen.lastIndexOf(":") + 1))];
const agent = new Agent(args.id, { secret: args.secret, baseUrl: args.kernel });
await agent.serve({ host, port }, edit);
console.log(`agent ${args.id} listening on http://${args.listen}/webhook, workspaces under ${driver.root}`);
