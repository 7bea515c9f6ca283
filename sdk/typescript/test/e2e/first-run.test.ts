/**
 * A first run against the real kernel: tools, local steps and LLM calls
 * through the AI SDK (Responses API and chat completions, plain and
 * streamed) and the official openai client, all recorded and replayed.
 */

import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { defineTool, execution, rebunoFetch, step, wrapTool } from "../../src/index.js";
import { serveAgent } from "../support/agents.js";
import { Kernel } from "../support/kernel.js";
import { type Entry, ScriptServer } from "../support/script-server.js";

let kernel: Kernel;
let llm: ScriptServer;

beforeAll(async () => {
  kernel = await new Kernel().start();
  llm = new ScriptServer([["write", "a.txt", "1"], ["read", "a.txt"], ["answer", "done with a.txt"]] satisfies Entry[]);
  await llm.start();
});
afterAll(async () => {
  await llm.stop();
  await kernel.destroy();
});

function fileTools(files: Map<string, string>, runs: string[]) {
  const writeFile = defineTool({
    name: "write_file",
    execute: ({ path, content }: { path: string; content: string }) => {
      runs.push(`write ${path}`);
      files.set(path, content);
      return `wrote ${path}`;
    },
  });
  const readFile = wrapTool(async function read_file({ path }: { path: string }) {
    runs.push(`read ${path}`);
    return files.get(path) ?? "";
  });
  return {
    write_file: tool({ description: "Write a file.", inputSchema: z.object({ path: z.string(), content: z.string() }), execute: (a) => writeFile(a) }),
    read_file: tool({ description: "Read a file.", inputSchema: z.object({ path: z.string() }), execute: (a) => readFile(a) }),
  };
}

describe("a first run", () => {
  it("records tools, local steps and LLM calls, and completes with the output", async () => {
    const runs: string[] = [];
    const files = new Map<string, string>();
    const served = await serveAgent(kernel, "first", async (input: { task: string }) => {
      const started = await step("started", () => 1234);
      const openai = createOpenAI({ fetch: rebunoFetch, baseURL: llm.url, apiKey: "test" });
      const result = await generateText({ model: openai("scripted-model"), prompt: input.task, tools: fileTools(files, runs), stopWhen: stepCountIs(6) });
      return { answer: result.text, started, executionId: execution().executionId };
    });
    const client = kernel.client();
    try {
      const ex = await client.create("first", { task: "write a.txt" });
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ answer: "done with a.txt", started: 1234, executionId: ex.id });
      expect(runs).toEqual(["write a.txt", "read a.txt"]);
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.kind, s.target, s.status])).toEqual([
        ["local", "started", "succeeded"],
        ["llm_call", "scripted-model", "succeeded"],
        ["tool_call", "write_file", "succeeded"],
        ["llm_call", "scripted-model", "succeeded"],
        ["tool_call", "read_file", "succeeded"],
        ["llm_call", "scripted-model", "succeeded"],
      ]);
      expect(steps[2]!.args).toEqual({ path: "a.txt", content: "1" });
      expect(steps[2]!.result).toBe("wrote a.txt");
      const llmRecord = steps[1]!.result as { status: number; headers: Record<string, string>; body: string };
      expect(llmRecord.status).toBe(200);
      expect(llmRecord.headers["content-type"]).toContain("application/json");
      expect(JSON.parse(llmRecord.body)).toMatchObject({ id: "resp_1" });
      expect(llm.counts("/v1/responses")).toEqual([0, 1, 2]);
    } finally {
      await served.close();
    }
  });

  it("streams through the chat completions wire, forwarding the stream to the kernel's side channel", async () => {
    const runs: string[] = [];
    const files = new Map<string, string>();
    let listening!: () => void;
    const listenerReady = new Promise<void>((resolve) => (listening = resolve));
    const served = await serveAgent(kernel, "streamer", async (input: { task: string }) => {
      await listenerReady;
      const openai = createOpenAI({ fetch: rebunoFetch, baseURL: llm.url, apiKey: "test" });
      const result = streamText({ model: openai.chat("scripted-chat"), prompt: input.task, tools: fileTools(files, runs), stopWhen: stepCountIs(6) });
      let text = "";
      for await (const delta of result.textStream) text += delta;
      return { text };
    });
    const client = kernel.client();
    try {
      const ex = await client.create("streamer", { task: "go" });
      // The kernel keeps no deltas: subscribe (headers received) before the handler streams.
      const resp = await fetch(`${kernel.url}/v0/executions/${ex.id}/stream`);
      expect(resp.status).toBe(200);
      listening();
      const frames = (await resp.text()).split("\n\n").filter((f) => f.startsWith("data: "))
        .map((f) => JSON.parse(f.slice(6)) as { step_id: string; seq: number; data: string });
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ text: "done with a.txt" });
      const llmSteps = (await client.steps(ex.id)).filter((s) => s.kind === "llm_call");
      expect(llmSteps).toHaveLength(3);
      for (const s of llmSteps) {
        const record = s.result as { headers: Record<string, string>; body: string };
        expect(record.headers["content-type"]).toContain("text/event-stream");
        expect((s.args as { stream?: boolean }).stream).toBe(true);
        // Every byte of the stream reached the side channel, in order.
        const mine = frames.filter((f) => f.step_id === s.stepId);
        expect(mine.map((f) => f.seq)).toEqual(mine.map((_, i) => i));
        expect(mine.map((f) => f.data).join("")).toBe(record.body);
      }
      expect(llm.requests.filter((r) => r.path === "/v1/chat/completions" && r.stream).map((r) => r.n)).toEqual([0, 1, 2]);
    } finally {
      await served.close();
    }
  });

  it("works as the official openai client's fetch", async () => {
    const served = await serveAgent(kernel, "official", async () => {
      const client = new OpenAI({ fetch: rebunoFetch, baseURL: llm.url, apiKey: "test", maxRetries: 0 });
      const completion = await client.chat.completions.create({ model: "gpt-test", messages: [{ role: "user", content: "hi" }] });
      return { call: completion.choices[0]!.message.tool_calls?.[0]?.type ?? null };
    });
    const client = kernel.client();
    try {
      const ex = await client.create("official", null);
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ call: "function" });
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.kind, s.target])).toEqual([["llm_call", "gpt-test"]]);
    } finally {
      await served.close();
    }
  });
});
