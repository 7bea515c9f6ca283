// Package wire holds the vocabulary of the Rebuno HTTP protocol: every decision,
// error code, status, event type, header name and limit appears here once, so
// that the kernel, the HTTP layer and the CLI spell them the same way.
package wire

import "slices"

// Step decisions (docs/protocol/steps.md §3, §10).
const (
	DecisionProceed           = "proceed"
	DecisionReplay            = "replay"
	DecisionDenied            = "denied"
	DecisionBlocked           = "blocked"
	DecisionExecutionBlocked  = "execution_blocked"
	DecisionRateLimited       = "rate_limited"
	DecisionExecutionTerminal = "execution_terminal"
	DecisionRecorded          = "recorded"
)

// Error codes of the envelope (docs/protocol/errors.md §2).
const (
	CodeValidation        = "validation_error"
	CodeUnauthorized      = "unauthorized"
	CodeForbidden         = "forbidden"
	CodeNotFound          = "not_found"
	CodeMethodNotAllowed  = "method_not_allowed"
	CodeConflict          = "conflict"
	CodeExecutionTerminal = "execution_terminal"
	CodeLeaseSuperseded   = "lease_superseded"
	CodePayloadTooLarge   = "payload_too_large"
	CodeUnsupportedMedia  = "unsupported_media_type"
	CodeInternal          = "internal_error"
	CodeUnavailable       = "unavailable"
)

// Step kinds and idempotency modes.
const (
	KindToolCall = "tool_call"
	KindLLMCall  = "llm_call"
	KindLocal    = "local"

	SafeToRetry = "safe_to_retry"
	AtMostOnce  = "at_most_once"
)

// ValidKind reports whether k is one of the three step kinds.
func ValidKind(k string) bool {
	return k == KindToolCall || k == KindLLMCall || k == KindLocal
}

// Execution statuses.
const (
	ExecPending   = "pending"
	ExecRunning   = "running"
	ExecBlocked   = "blocked"
	ExecCompleted = "completed"
	ExecFailed    = "failed"
	ExecCancelled = "cancelled"
)

// ExecutionStatuses lists every execution status, for validation of filters.
var ExecutionStatuses = []string{ExecPending, ExecRunning, ExecBlocked, ExecCompleted, ExecFailed, ExecCancelled}

// ExecTerminalStatuses are the statuses an execution never leaves; every
// other status is live.
var ExecTerminalStatuses = []string{ExecCompleted, ExecFailed, ExecCancelled}

// ExecTerminal reports whether an execution status is terminal.
func ExecTerminal(s string) bool { return slices.Contains(ExecTerminalStatuses, s) }

// Step statuses.
const (
	StepProposed         = "proposed"
	StepAllowed          = "allowed"
	StepDenied           = "denied"
	StepAwaitingApproval = "awaiting_approval"
	StepExecuting        = "executing"
	StepSucceeded        = "succeeded"
	StepFailed           = "failed"
	StepCancelled        = "cancelled"
)

// StepStatuses lists every step status, for validation of filters.
var StepStatuses = []string{StepProposed, StepAllowed, StepDenied, StepAwaitingApproval, StepExecuting, StepSucceeded, StepFailed, StepCancelled}

// StepTerminalStatuses are the statuses a step never leaves.
var StepTerminalStatuses = []string{StepSucceeded, StepFailed, StepDenied, StepCancelled}

// StepTerminal reports whether a step status is terminal.
func StepTerminal(s string) bool { return slices.Contains(StepTerminalStatuses, s) }

// Approval statuses.
const (
	ApprovalPending = "pending"
	ApprovalGranted = "granted"
	ApprovalDenied  = "denied"
	ApprovalExpired = "expired"
)

// Dispatch statuses (internal, docs/protocol/dispatch.md §1).
const (
	DispatchPending  = "pending"
	DispatchInFlight = "in_flight"
	DispatchFailed   = "failed"
	DispatchRetired  = "retired"
)

// Event types (docs/protocol/events.md §2).
const (
	EventExecutionCreated   = "execution.created"
	EventExecutionForked    = "execution.forked"
	EventExecutionStarted   = "execution.started"
	EventExecutionBlocked   = "execution.blocked"
	EventExecutionResumed   = "execution.resumed"
	EventExecutionCompleted = "execution.completed"
	EventExecutionFailed    = "execution.failed"
	EventExecutionCancelled = "execution.cancelled"

	EventStepProposed         = "step.proposed"
	EventStepAllowed          = "step.allowed"
	EventStepExecuting        = "step.executing"
	EventStepAwaitingApproval = "step.awaiting_approval"
	EventStepDenied           = "step.denied"
	EventStepSucceeded        = "step.succeeded"
	EventStepFailed           = "step.failed"
	EventStepCancelled        = "step.cancelled"
	EventStepRateLimited      = "step.rate_limited"

	EventApprovalRequested = "approval.requested"
	EventApprovalGranted   = "approval.granted"
	EventApprovalDenied    = "approval.denied"
	EventApprovalExpired   = "approval.expired"

	EventDispatchQueued       = "dispatch.queued"
	EventDispatchAcked        = "dispatch.acked"
	EventDispatchFailed       = "dispatch.failed"
	EventDispatchLeaseExpired = "dispatch.lease_expired"
)

// Special rule ids (docs/protocol/README.md §6).
const (
	RuleDefault            = "default"
	RuleLocal              = "local"
	RulePermissive         = "permissive"
	RuleBundleError        = "bundle-error"
	RuleIndeterminateRetry = "__indeterminate_retry"
)

// Reasons, rationales and clean-up causes (docs/protocol/README.md §6).
const (
	ReasonPolicyDenied         = "policy_denied"
	ReasonNoAllowRule          = "no explicit allow rule matched"
	ReasonDefaultAllow         = "default allow"
	ReasonLocalStep            = "local step"
	ReasonPolicyBundleInvalid  = "policy_bundle_invalid"
	ReasonRateLimitExceeded    = "rate_limit_exceeded"
	ReasonRateLimiterUnavail   = "rate_limiter_unavailable"
	ReasonApprovalDenied       = "approval_denied"
	ReasonApprovalTimeout      = "approval_timeout"
	ReasonTimeout              = "timeout"
	ReasonIndeterminate        = "indeterminate"
	ReasonIndeterminateRefused = "prior attempt outcome unknown; retry refused"
	ReasonDispatchExhausted    = "dispatch_exhausted"
	ReasonClientCancelled      = "client_cancelled"
	ReasonDeadlineExceeded     = "deadline_exceeded"
	ReasonStorageLimitExceeded = "storage_limit_exceeded"
	CauseExecutionCompleted    = "execution_completed"
	CauseExecutionFailed       = "execution_failed"
	CauseExecutionCancelled    = "execution_cancelled"
	CauseDeadlineExceeded      = "deadline_exceeded"
	IndeterminateMessage       = "outcome unknown: this may already have taken effect. Check the state before continuing."
)

// Header names (docs/protocol/README.md §6).
const (
	HeaderAuthorization   = "Authorization"
	HeaderAgentID         = "Rebuno-Agent-Id"
	HeaderSignature       = "Rebuno-Signature"
	HeaderTimestamp       = "Rebuno-Timestamp"
	HeaderDispatchID      = "Rebuno-Dispatch-Id"
	HeaderDispatchAttempt = "Rebuno-Dispatch-Attempt"
	HeaderStepOccurrence  = "Rebuno-Step-Occurrence"
	// HeaderOccurrenceSignature binds Rebuno-Step-Occurrence to the signed
	// request, which the v1 signature alone does not cover.
	HeaderOccurrenceSignature = "Rebuno-Occurrence-Signature"
	HeaderExecutionID         = "Rebuno-Execution-Id"
	HeaderRequestID           = "Rebuno-Request-Id"
	HeaderIdempotencyKey      = "Idempotency-Key"
	HeaderLastEventID         = "Last-Event-ID"
	HeaderRetryAfter          = "Retry-After"
	HeaderAllow               = "Allow"
	// HeaderExtensions lists the protocol extensions the kernel accepts on
	// submit answers (docs/protocol/steps.md §13).
	HeaderExtensions       = "Rebuno-Extensions"
	SignaturePrefixV1      = "v1="
	SignaturePrefixLegacy  = "sha256="
	SignatureMessagePrefix = "rebuno-request-v1"
	// OccurrenceMessagePrefix starts the message an occurrence signature covers.
	OccurrenceMessagePrefix = "rebuno-occurrence-v1"
)

// Protocol extensions, advertised in Rebuno-Extensions.
const (
	// ExtCarriedOutcome lets a submit, execution complete or fail carry an
	// earlier step's outcome (docs/protocol/steps.md §13).
	ExtCarriedOutcome = "carried-outcome"
)

// Limits (docs/protocol/README.md §6).
const (
	MaxNesting            = 128
	MaxDeltaBytes         = 7000
	MaxTargetBytes        = 1024
	MaxAgentIDBytes       = 128
	MaxURLBytes           = 2048
	MaxSecretBytes        = 1024
	MaxFailureReasonBytes = 8192
	MaxShortStringBytes   = 256 // agent_version, on_behalf_of, decided_by
	MaxDescriptionBytes   = 4096
	MaxSchemaBytes        = 256 * 1024
	MaxRationaleBytes     = 4096
	MaxIdempotencyKey     = 128
	MaxResourcesPerStep   = 32
	MaxResourceKeyBytes   = 128
	MaxWebhookReadBytes   = 64 * 1024
	SignatureWindowSecs   = 300
	MaxLeaseSeconds       = 86400
	DefaultListLimit      = 50
	MaxListLimit          = 200
	DefaultEventsLimit    = 100
	MaxEventsLimit        = 1000
	MaxApprovalsLimit     = 1000
	StepsPageSize         = 1000
)
