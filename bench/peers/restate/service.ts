/**
 * Restate's TypeScript row: a service whose handler runs STEPS no-op
 * `ctx.run` steps, each journaled by restate-server, served over HTTP/2
 * cleartext as restate-server expects.
 */

import http2 from "node:http2";
import * as restate from "@restatedev/restate-sdk";

// The SDK calls Promise.withResolvers, which Node 20 lacks (Node 22 has it).
type Resolvers<T> = { promise: Promise<T>; resolve: (v: T | PromiseLike<T>) => void; reject: (e?: unknown) => void };
const withResolvers = <T>(): Resolvers<T> => {
  let resolve!: Resolvers<T>["resolve"];
  let reject!: Resolvers<T>["reject"];
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
};
(Promise as unknown as { withResolvers?: typeof withResolvers }).withResolvers ??= withResolvers;

const bench = restate.service({
  name: "Bench",
  handlers: {
    run: async (ctx: restate.Context, n: number): Promise<number> => {
      for (let i = 0; i < n; i++) await ctx.run("noop", async () => i);
      return n;
    },
  },
});

http2.createServer(restate.endpoint().bind(bench).http2Handler()).listen(Number(process.env.PORT), "127.0.0.1");
