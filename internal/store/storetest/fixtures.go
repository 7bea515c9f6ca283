package storetest

import (
	"fmt"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// fullExecution sets every field to a distinct, non-zero value, so that a
// swapped or dropped column shows.
func fullExecution(id string) *store.Execution {
	return &store.Execution{
		ID:             id,
		AgentID:        "agent-α",
		AgentVersion:   "v1.2.3",
		Input:          []byte(" {\"b\" : 1,\n\t\"a\":[ 1 , 2.50 ], \"u\":\"\\u00e9é🙂\"}  "),
		Status:         wire.ExecRunning,
		Output:         []byte("\n\"ok\"\t"),
		State:          []byte(`{ "k" :  "v" , "n":null }`),
		FailureReason:  "failure reason kept verbatim",
		CreatedAt:      base,
		UpdatedAt:      at(1500 * time.Microsecond),
		DeadlineAt:     at(time.Hour + 7*time.Microsecond),
		ParentID:       "parent-" + id,
		IdempotencyKey: "idem-" + id,
		OnBehalfOf:     "user:42",
		ForkedFrom:     "source-" + id,
		ForkSeq:        17,
		Restoration:    []byte(`{"steps" : [ ] ,"x":1}`),
		ResourceKeys:   []string{"zeta", "alpha", "mid"},
		Writing:        []string{"step-b", "step-a"},
		DispatchID:     "dispatch-" + id,
		LastSeq:        9,
		StepOrder:      4,
		StepCount:      3,
		ByteCount:      12345,
	}
}

// minimalExecution sets only what every execution has.
func minimalExecution(id, agentID, status string) *store.Execution {
	return &store.Execution{ID: id, AgentID: agentID, Input: []byte("null"), Status: status, CreatedAt: base, UpdatedAt: base}
}

// events makes events from..to of an execution.
func events(executionID string, from, to int64) []*store.Event {
	var out []*store.Event
	for seq := from; seq <= to; seq++ {
		typ := wire.EventStepProposed
		if seq%2 == 0 {
			typ = wire.EventStepSucceeded
		}
		out = append(out, &store.Event{
			ExecutionID: executionID,
			Seq:         seq,
			Type:        typ,
			Payload:     fmt.Appendf(nil, " { \"execution\" : %q,\n \"seq\":%d }\n", executionID, seq),
			OccurredAt:  at(time.Duration(seq)*time.Millisecond + time.Duration(seq)*time.Microsecond),
		})
	}
	return out
}

func fullStep(executionID, stepID string) *store.Step {
	return &store.Step{
		ExecutionID: executionID,
		StepID:      stepID,
		Order:       7,
		Kind:        wire.KindToolCall,
		Target:      "web.search",
		ArgsHash:    "sha256:0123abcd",
		Occurrence:  2,
		Status:      wire.StepFailed,
		Idempotency: wire.AtMostOnce,
		Args:        []byte(" { \"q\" : \"rebuno\" ,\n\"n\":[1, 2] } "),
		Result:      []byte(`  {"hits":  3}`),
		Error:       []byte(`{"reason" : "timeout", "message":"slow"}`),
		ErrorReason: wire.ReasonTimeout,
		Resources:   []string{"res-b", "res-a"},
		StartedAt:   at(2 * time.Second),
		CompletedAt: at(3*time.Second + 11*time.Microsecond),
		DispatchID:  "dispatch-" + executionID,
		Attempt:     3,
		TerminalSeq: 41,
	}
}

// simpleStep is a step whose identity is (tool_call, "tool", "h-"+stepID).
func simpleStep(executionID, stepID string, order int64, status string) *store.Step {
	return &store.Step{
		ExecutionID: executionID, StepID: stepID, Order: order, Kind: wire.KindToolCall, Target: "tool",
		ArgsHash: "h-" + stepID, Occurrence: 1, Status: status, Idempotency: wire.SafeToRetry, Args: []byte(`{}`),
	}
}

func fullDispatch(id, executionID string) *store.Dispatch {
	return &store.Dispatch{
		ID: id, ExecutionID: executionID, Status: wire.DispatchInFlight, Attempt: 2, MaxAttempts: 5,
		ProgressAttempt: 1, LeaseTimeout: 120, NextAttemptAt: at(10 * time.Second),
		LeaseExpiresAt: at(130*time.Second + 3*time.Microsecond), ClaimedBy: "replica-1",
		CreatedAt: at(time.Second), UpdatedAt: at(9 * time.Second),
	}
}

func simpleDispatch(id, executionID, status string, next, lease time.Time) *store.Dispatch {
	return &store.Dispatch{
		ID: id, ExecutionID: executionID, Status: status, MaxAttempts: 5, LeaseTimeout: 60,
		NextAttemptAt: next, LeaseExpiresAt: lease, CreatedAt: base, UpdatedAt: base,
	}
}

func fullAgent(id string) *store.Agent {
	return &store.Agent{
		ID: id, WebhookURL: "http://127.0.0.1:9/hook?x=1", Secret: "s3cr3t-" + id,
		PolicyBundle: "rules:\n  - allow: \"*\"\n", LeaseTimeoutSeconds: 45, Description: "Résumé agent",
		InputSchema: []byte(`{"type" : "object"}`), OutputSchema: []byte(`{ "type":"string" }`),
		RegisteredAt: at(time.Second), UpdatedAt: at(2 * time.Second),
	}
}
