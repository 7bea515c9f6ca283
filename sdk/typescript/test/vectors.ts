/** The shared wire test vectors of docs/protocol/vectors (also read by the Go and Python tests). */

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const DIR = fileURLToPath(new URL("../../../docs/protocol/vectors/", import.meta.url));

export function loadVectors<T>(name: "canonical-json" | "step-ids" | "signatures" | "local-directory" | "carried-outcomes"): T {
  return JSON.parse(readFileSync(`${DIR}${name}.json`, "utf8")) as T;
}

export interface CanonicalCase { name: string; args: string; canonical_hex: string; args_hash: string }
export interface StepIdCase { name: string; kind: string; target: string; args: string; args_hash: string; occurrence: number; preimage: string; step_id: string }
export interface RequestCase {
  name: string; secret: string; method: string; target: string; timestamp: string; dispatch_id: string | null;
  dispatch_attempt: string | null; body: string; message: string; message_length: number; signature: string; legacy_signature?: string;
}
export interface OccurrenceCase { secret: string; request_signature: string; occurrence: string; message: string; signature: string }
export interface TreeFile { path: string; type: "file" | "dir" | "symlink"; mode?: number; content?: string; target?: string }
export interface ManifestCase { name: string; files: TreeFile[]; manifest: string; manifest_length: number; ref: string }
export interface CarriedOutcomeCase {
  name: string;
  carrier: "submit" | "complete" | "fail";
  submit?: { kind: string; target: string; args: string; idempotency: string; resources: string[] };
  output?: string;
  reason?: string;
  outcome: { step_id: string; succeeded: boolean; value: string; captures: { key: string; generation: number; checkpoint_ref: string }[]; capture_failures: { key: string; generation: number; error: string }[] };
  body: string;
}
