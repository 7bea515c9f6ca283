import { env } from "node:process";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { Agent, defineTool, rebunoFetch, resource } from "rebuno";
import { z } from "zod";
import { E2BResource } from "./workspace-resource.js";

async function process(input: { task: string }) {
  const workspace = await resource("workspace", {
    driver: new E2BResource(600_000),
    checkpoints: { everySteps: 5 },
  });
  const writeFile = defineTool({
    name: "write_file",
    resources: ["workspace"],
    execute: async ({ path, content }: { path: string; content: string }) => {
      await workspace.files.write(path, content);
      return `wrote ${path}`;
    },
  });
  const readFile = defineTool({
    name: "read_file",
    execute: ({ path }: { path: string }) => workspace.files.read(path),
  });
  const modelName = env.LLM_MODEL;
  if (!modelName) throw new Error("LLM_MODEL is required");
  const openai = createOpenAI({ fetch: rebunoFetch });
  const result = await generateText({
    model: openai(modelName),
    prompt: input.task,
    tools: {
      write_file: tool({
        description: "Write a file in the workspace.",
        inputSchema: z.object({ path: z.string(), content: z.string() }),
        execute: (args) => writeFile(args),
      }),
      read_file: tool({
        description: "Read a file from the workspace.",
        inputSchema: z.object({ path: z.string() }),
        execute: (args) => readFile(args),
      }),
    },
    stopWhen: stepCountIs(12),
  });
  return { answer: result.text };
}

await new Agent("coder").serve({ port: 5000 }, process);
