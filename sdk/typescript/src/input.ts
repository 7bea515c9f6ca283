/**
 * Handler input validation with a Standard Schema (zod, valibot, arktype,
 * ...): the schema library is the user's, the SDK only calls the standard
 * `~standard.validate`. Without a schema the handler gets the input as
 * recorded. With one, the input must be a JSON object (`null` counts as
 * `{}`), and a validation failure fails the execution with
 * `input validation failed: <issues>`.
 */

import { isRecord } from "./errors.js";

/** The part of the Standard Schema interface (v1) the SDK uses. */
export interface StandardSchemaV1<Input = unknown, Output = Input> {
  readonly "~standard": {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (value: unknown) => StandardResult<Output> | Promise<StandardResult<Output>>;
    readonly types?: { readonly input: Input; readonly output: Output } | undefined;
  };
}

export type StandardResult<Output> =
  | { readonly value: Output; readonly issues?: undefined }
  | { readonly issues: ReadonlyArray<StandardIssue> };

export interface StandardIssue {
  readonly message: string;
  readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> | undefined;
}

/** The input a schema accepts. */
export type SchemaOutput<S> = S extends StandardSchemaV1<unknown, infer O> ? O : never;

/** The input cannot be bound; `reason` is the execution's failure reason. */
export class BindingError extends Error {
  constructor(readonly reason: string) {
    super(reason);
    this.name = "BindingError";
  }
}

function formatIssues(issues: ReadonlyArray<StandardIssue>): string {
  return issues.map((issue) => {
    const path = (issue.path ?? []).map((p) => String(typeof p === "object" && p !== null ? p.key : p)).join(".");
    return path ? `${path}: ${issue.message}` : issue.message;
  }).join("; ");
}

export function isStandardSchema(v: unknown): v is StandardSchemaV1 {
  return typeof v === "object" && v !== null && typeof (v as StandardSchemaV1)["~standard"]?.validate === "function";
}

/** The handler's argument for an input, or `BindingError`. */
export async function bindInput(schema: StandardSchemaV1 | undefined, input: unknown): Promise<unknown> {
  if (schema === undefined) return input;
  const value = input === null || input === undefined ? {} : input;
  if (!isRecord(value)) throw new BindingError("input must be a JSON object");
  let result: StandardResult<unknown>;
  try {
    result = await schema["~standard"].validate(value);
  } catch (e) {
    throw new BindingError(`input validation failed: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (result.issues) throw new BindingError(`input validation failed: ${formatIssues(result.issues)}`);
  return result.value;
}

/** The JSON Schema a schema publishes as agent metadata, when its library offers one. */
export function inputJsonSchema(schema: StandardSchemaV1 | undefined): Record<string, unknown> | undefined {
  if (schema === undefined) return undefined;
  const std = schema["~standard"] as { jsonSchema?: { input?: (o: { target: string }) => unknown } };
  try {
    const out = std.jsonSchema?.input?.({ target: "draft-2020-12" });
    return isRecord(out) ? out : undefined;
  } catch {
    return undefined;
  }
}
