/**
 * Shapes the kernel returns, in camelCase. Each `fromWire` function reads
 * the kernel's snake_case JSON and ignores fields it does not know, so a
 * newer kernel never breaks an older SDK. User JSON (`input`, `output`,
 * `args`, `result`, `error`, event payloads, bindings) is kept verbatim.
 */

import { isRecord } from "./errors.js";

export type ExecutionStatus = "pending" | "running" | "blocked" | "completed" | "failed" | "cancelled";
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set(["completed", "failed", "cancelled"]);

type Wire = Record<string, unknown>;

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const num = (v: unknown): number | undefined => (typeof v === "number" ? v : undefined);
const bool = (v: unknown): boolean => v === true;
const strs = (v: unknown): string[] => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);
const record = (v: unknown): Wire => (isRecord(v) ? v : {});
const list = (v: unknown): Wire[] => (Array.isArray(v) ? v.filter(isRecord) : []);
const ranges = (v: unknown): [number, number][] =>
  Array.isArray(v) ? v.filter((r): r is [number, number] => Array.isArray(r) && r.length === 2).map((r) => [r[0], r[1]]) : [];

export interface Execution {
  id: string;
  agentId: string;
  status: ExecutionStatus | string;
  input: unknown;
  output: unknown;
  agentVersion?: string | undefined;
  failureReason?: string | undefined;
  createdAt?: string | undefined;
  updatedAt?: string | undefined;
  deadlineAt?: string | undefined;
  parentExecutionId?: string | undefined;
  idempotencyKey?: string | undefined;
  onBehalfOf?: string | undefined;
  forkedFrom?: string | undefined;
  forkSeq?: number | undefined;
  restoration?: Record<string, unknown> | undefined;
  resourceKeys: string[];
  /** Whether the status is completed, failed or cancelled. */
  terminal: boolean;
}

export function executionFromWire(v: unknown): Execution {
  const w = record(v);
  const status = str(w.status) ?? "";
  return {
    id: str(w.id) ?? "",
    agentId: str(w.agent_id) ?? "",
    status,
    input: w.input ?? null,
    output: w.output ?? null,
    agentVersion: str(w.agent_version),
    failureReason: str(w.failure_reason),
    createdAt: str(w.created_at),
    updatedAt: str(w.updated_at),
    deadlineAt: str(w.deadline_at),
    parentExecutionId: str(w.parent_execution_id),
    idempotencyKey: str(w.idempotency_key),
    onBehalfOf: str(w.on_behalf_of),
    forkedFrom: str(w.forked_from),
    forkSeq: num(w.fork_seq),
    restoration: isRecord(w.restoration) ? w.restoration : undefined,
    resourceKeys: strs(w.resource_keys),
    terminal: TERMINAL_STATUSES.has(status),
  };
}

export interface ExecutionPage {
  executions: Execution[];
  nextCursor?: string | undefined;
}

export function pageFromWire(v: unknown): ExecutionPage {
  const w = record(v);
  return { executions: list(w.executions).map(executionFromWire), nextCursor: str(w.next_cursor) || undefined };
}

export interface Step {
  stepId: string;
  executionId: string;
  kind: string;
  target: string;
  argsHash: string;
  occurrence: number;
  status: string;
  idempotency: string;
  args: unknown;
  result: unknown;
  error: unknown;
  resources: string[];
  startedAt?: string | undefined;
  completedAt?: string | undefined;
}

export function stepFromWire(v: unknown): Step {
  const w = record(v);
  return {
    stepId: str(w.step_id) ?? "",
    executionId: str(w.execution_id) ?? "",
    kind: str(w.kind) ?? "",
    target: str(w.target) ?? "",
    argsHash: str(w.args_hash) ?? "",
    occurrence: num(w.occurrence) ?? 0,
    status: str(w.status) ?? "",
    idempotency: str(w.idempotency) ?? "safe_to_retry",
    args: w.args ?? null,
    result: w.result ?? null,
    error: w.error ?? null,
    resources: strs(w.resources),
    startedAt: str(w.started_at),
    completedAt: str(w.completed_at),
  };
}

export interface Event {
  executionId: string;
  eventSeq: number;
  type: string;
  payload: Record<string, unknown>;
  occurredAt?: string | undefined;
}

export function eventFromWire(v: unknown): Event {
  const w = record(v);
  return {
    executionId: str(w.execution_id) ?? "",
    eventSeq: num(w.event_seq) ?? 0,
    type: str(w.type) ?? "",
    payload: record(w.payload),
    occurredAt: str(w.occurred_at),
  };
}

export interface Approval {
  id: string;
  stepId: string;
  executionId: string;
  agentId: string;
  kind: string;
  target: string;
  status: string;
  approvers: string[];
  message?: string | undefined;
  timeoutAt?: string | undefined;
  decidedBy?: string | undefined;
  decidedAt?: string | undefined;
  rationale?: string | undefined;
  createdAt?: string | undefined;
}

export function approvalFromWire(v: unknown): Approval {
  const w = record(v);
  return {
    id: str(w.id) ?? "",
    stepId: str(w.step_id) ?? "",
    executionId: str(w.execution_id) ?? "",
    agentId: str(w.agent_id) ?? "",
    kind: str(w.kind) ?? "",
    target: str(w.target) ?? "",
    status: str(w.status) ?? "",
    approvers: strs(w.approvers),
    message: str(w.message),
    timeoutAt: str(w.timeout_at),
    decidedBy: str(w.decided_by),
    decidedAt: str(w.decided_at),
    rationale: str(w.rationale),
    createdAt: str(w.created_at),
  };
}

export interface AgentInfo {
  id: string;
  webhookUrl: string;
  policyBundle: string;
  leaseTimeoutSeconds?: number | undefined;
  description?: string | undefined;
  inputSchema?: Record<string, unknown> | undefined;
  outputSchema?: Record<string, unknown> | undefined;
  registeredAt?: string | undefined;
  updatedAt?: string | undefined;
}

export function agentFromWire(v: unknown): AgentInfo {
  const w = record(v);
  return {
    id: str(w.id) ?? "",
    webhookUrl: str(w.webhook_url) ?? "",
    policyBundle: str(w.policy_bundle) ?? "",
    leaseTimeoutSeconds: num(w.lease_timeout_seconds),
    description: str(w.description),
    inputSchema: isRecord(w.input_schema) ? w.input_schema : undefined,
    outputSchema: isRecord(w.output_schema) ? w.output_schema : undefined,
    registeredAt: str(w.registered_at),
    updatedAt: str(w.updated_at),
  };
}

/** One entry of `proceed.resources`: a generation a start raised, and whether a capture is due. */
export interface DecisionResource {
  key: string;
  generation: number;
  due: boolean;
}

/** The answer to submit, step complete and step fail. */
export interface Decision {
  decision: string;
  stepId?: string | undefined;
  result?: unknown;
  error?: unknown;
  /** Which of `result` / `error` the kernel sent (`null` is a valid result). */
  hasResult: boolean;
  hasError: boolean;
  approvalId?: string | undefined;
  reason?: string | undefined;
  ruleId?: string | undefined;
  retryAfterMs?: number | undefined;
  resources?: DecisionResource[] | undefined;
}

export function decisionFromWire(v: unknown): Decision {
  const w = record(v);
  return {
    decision: str(w.decision) ?? "",
    stepId: str(w.step_id),
    result: w.result,
    error: w.error,
    hasResult: "result" in w,
    hasError: "error" in w,
    approvalId: str(w.approval_id),
    reason: str(w.reason),
    ruleId: str(w.rule_id),
    retryAfterMs: num(w.retry_after_ms),
    resources: Array.isArray(w.resources)
      ? list(w.resources).map((r) => ({ key: str(r.key) ?? "", generation: num(r.generation) ?? 0, due: bool(r.due) }))
      : undefined,
  };
}

/** A resource of an execution: the view every register answers with. */
export interface Resource {
  key: string;
  driverId: string;
  configuration: unknown;
  coverageReuse: boolean;
  everySteps: number;
  onCompletion: boolean;
  registeredSeq: number;
  generation: number;
  binding: unknown;
  /** The ref a fork's resource is restored from; "" for the initial environment. */
  checkpointRef: string;
  /** Coverage at the current end of the log. */
  covered: boolean;
}

export function resourceFromWire(v: unknown): Resource {
  const w = record(v);
  return {
    key: str(w.key) ?? "",
    driverId: str(w.driver_id) ?? "",
    configuration: w.configuration ?? null,
    coverageReuse: bool(w.coverage_reuse),
    everySteps: num(w.every_steps) ?? 0,
    onCompletion: bool(w.on_completion),
    registeredSeq: num(w.registered_seq) ?? 0,
    generation: num(w.generation) ?? 0,
    binding: w.binding ?? null,
    checkpointRef: str(w.checkpoint_ref) ?? "",
    covered: bool(w.covered),
  };
}

/** One resource of a coverage point; `reason` is `covered`, `no_checkpoint` or `step_started`. */
export interface ResourceCoverage {
  key: string;
  covered: boolean;
  reason: string;
  checkpointRef?: string | undefined;
  checkpointSeq?: number | undefined;
}

/** Coverage at one event. An empty `resources` list means the point is vacuously covered. */
export interface CoveragePoint {
  executionId: string;
  atSeq: number;
  covered: boolean;
  resources: ResourceCoverage[];
}

export function coveragePointFromWire(v: unknown): CoveragePoint {
  const w = record(v);
  return {
    executionId: str(w.execution_id) ?? "",
    atSeq: num(w.at_seq) ?? 0,
    covered: bool(w.covered),
    resources: list(w.resources).map((r) => ({
      key: str(r.key) ?? "",
      covered: bool(r.covered),
      reason: str(r.reason) ?? "",
      checkpointRef: str(r.checkpoint_ref),
      checkpointSeq: num(r.checkpoint_seq),
    })),
  };
}

export interface ResourceRanges {
  key: string;
  registeredSeq: number;
  coveredRanges: [number, number][];
}

/** The covered ranges of a whole log, inclusive; an open range ends at `lastEventSeq`. */
export interface CoverageRanges {
  executionId: string;
  lastEventSeq: number;
  coveredRanges: [number, number][];
  resources: ResourceRanges[];
}

export function coverageRangesFromWire(v: unknown): CoverageRanges {
  const w = record(v);
  return {
    executionId: str(w.execution_id) ?? "",
    lastEventSeq: num(w.last_event_seq) ?? 0,
    coveredRanges: ranges(w.covered_ranges),
    resources: list(w.resources).map((r) => ({
      key: str(r.key) ?? "",
      registeredSeq: num(r.registered_seq) ?? 0,
      coveredRanges: ranges(r.covered_ranges),
    })),
  };
}

/** Whether event `seq` lies in one of the ranges. */
export function isCovered(ranges: CoverageRanges, seq: number): boolean {
  return ranges.coveredRanges.some(([lo, hi]) => lo <= seq && seq <= hi);
}

/** One live delta of a running step. */
export interface StreamDelta {
  stepId: string;
  seq: number;
  data: string;
}

export function deltaFromWire(v: unknown): StreamDelta {
  const w = record(v);
  return { stepId: str(w.step_id) ?? "", seq: num(w.seq) ?? 0, data: str(w.data) ?? "" };
}
