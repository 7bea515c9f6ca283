/**
 * The command loop every TypeScript client of the peers benchmark runs (the
 * Python clients' loop.py, same conversation): `run COUNT CONCURRENCY` lines
 * on stdin, `done` after each, `ready HOW` first.
 */

import { createInterface } from "node:readline";

export const STEPS = Number(process.env.STEPS ?? "10");

export async function serve(one: () => Promise<void>, how: string): Promise<void> {
  console.log(`ready ${how}`);
  for await (const line of createInterface({ input: process.stdin })) {
    const [, count, concurrency] = line.split(" ").map(Number) as [number, number, number];
    let started = 0;
    const worker = async (): Promise<void> => {
      while (started < count) {
        started++;
        await one();
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    console.log("done");
  }
}

/** Every workflow of the benchmark returns its number of steps. */
export function check(result: unknown): void {
  if (result !== STEPS) throw new Error(`unexpected result ${JSON.stringify(result)}`);
}
