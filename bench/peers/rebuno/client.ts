/**
 * The client of Rebuno's TypeScript row (client.py on the TypeScript SDK's
 * `Client`): each execution is one `client.run` request.
 */

import { Client } from "../../../sdk/typescript/dist/index.js";
import { check, serve, STEPS } from "../loop.ts";

const AGENT_ID = process.env.AGENT_ID!;
const client = new Client(process.env.REBUNO_URL!);
await client.registerAgent(AGENT_ID, process.env.AGENT_URL!, process.env.REBUNO_AGENT_SECRET!);

await serve(async () => check(await client.run(AGENT_ID, { n: STEPS })), "client.run");
