import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // One kernel, agent and browser at a time: the machine has two cores.
    fileParallelism: false,
    pool: "forks",
  },
});
