package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// agentScenarios are the scenarios of agents.
var agentScenarios = []scenario{
	{"Agents", testAgents},
	{"AgentHasLiveExecutions", testAgentHasLiveExecutions},
}

func testAgents(t *testing.T, s store.Store) {
	ctx := t.Context()
	orig := fullAgent("bravo")
	bare := &store.Agent{ID: "alpha", WebhookURL: "http://h/a", Secret: "x", RegisteredAt: base, UpdatedAt: base}
	write(t, s, orig, bare, &store.Agent{ID: "delta", WebhookURL: "http://h/d", Secret: "d", RegisteredAt: base, UpdatedAt: base},
		&store.Agent{ID: "charlie", WebhookURL: "http://h/c", Secret: "c", RegisteredAt: base, UpdatedAt: base})
	same(t, "agent", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), orig)
	gotBare := val(s.Read().Agent(ctx, "alpha")).get(t, "Agent")
	same(t, "bare agent", gotBare, bare)
	if gotBare.InputSchema != nil || gotBare.OutputSchema != nil {
		t.Errorf("bare agent schemas: got %q and %q, want nil", gotBare.InputSchema, gotBare.OutputSchema)
	}
	_, err := s.Read().Agent(ctx, "missing")
	wantNotFound(t, "Agent of an unknown id", err)

	// Registering again replaces the endpoint, secret and lease timeout and
	// keeps the policy, metadata and registration time.
	again := &store.Agent{ID: "bravo", WebhookURL: "https://example.test/new", Secret: "rotated", PolicyBundle: "other policy",
		LeaseTimeoutSeconds: 90, Description: "other", InputSchema: []byte(`{"other":1}`), OutputSchema: nil,
		RegisteredAt: at(10 * time.Hour), UpdatedAt: at(3 * time.Second)}
	write(t, s, again)
	want := *orig
	want.WebhookURL, want.Secret, want.LeaseTimeoutSeconds, want.UpdatedAt = again.WebhookURL, again.Secret, 90, again.UpdatedAt
	same(t, "agent registered again", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), &want)

	var errPolicy, errMeta, errDelete, errPolicyAgain error
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.SetAgentPolicy(ctx, "bravo", "bundle 2", at(4*time.Second)); err != nil {
			return err
		}
		// Writing the same policy again is not "not found".
		errPolicyAgain = tx.SetAgentPolicy(ctx, "bravo", "bundle 2", at(4*time.Second))
		if err := tx.UpdateAgentMetadata(ctx, "bravo", "desc 3", []byte(` {"in" : 3} `), nil, at(5*time.Second)); err != nil {
			return err
		}
		errPolicy = tx.SetAgentPolicy(ctx, "missing", "p", at(time.Hour))
		errMeta = tx.UpdateAgentMetadata(ctx, "missing", "d", nil, nil, at(time.Hour))
		errDelete = tx.DeleteAgent(ctx, "missing")
		return nil
	})
	if errPolicyAgain != nil {
		t.Errorf("SetAgentPolicy with an unchanged bundle: %v", errPolicyAgain)
	}
	wantNotFound(t, "SetAgentPolicy of an unknown agent", errPolicy)
	wantNotFound(t, "UpdateAgentMetadata of an unknown agent", errMeta)
	wantNotFound(t, "DeleteAgent of an unknown agent", errDelete)
	want.PolicyBundle = "bundle 2"
	want.Description = "desc 3"
	want.InputSchema = []byte(` {"in" : 3} `)
	want.OutputSchema = nil
	want.UpdatedAt = at(5 * time.Second)
	same(t, "agent after policy and metadata", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), &want)

	// Registering again still keeps what SetAgentPolicy and
	// UpdateAgentMetadata wrote.
	again.UpdatedAt = at(6 * time.Second)
	write(t, s, again)
	want.UpdatedAt = again.UpdatedAt
	same(t, "agent registered a third time", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), &want)

	list := val(s.Read().ListAgents(ctx)).get(t, "ListAgents")
	ids := make([]string, len(list))
	for i, a := range list {
		ids[i] = a.ID
	}
	sameStrings(t, "ListAgents", ids, []string{"alpha", "bravo", "charlie", "delta"})
	if len(list) == 4 {
		same(t, "listed agent", list[1], &want)
	}

	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteAgent(ctx, "charlie") })
	_, err = s.Read().Agent(ctx, "charlie")
	wantNotFound(t, "Agent after DeleteAgent", err)
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteAgent(ctx, "charlie") })
	wantNotFound(t, "DeleteAgent a second time", err)
	list = val(s.Read().ListAgents(ctx)).get(t, "ListAgents")
	ids = ids[:0]
	for _, a := range list {
		ids = append(ids, a.ID)
	}
	sameStrings(t, "ListAgents after delete", ids, []string{"alpha", "bravo", "delta"})
}

func testAgentHasLiveExecutions(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s,
		minimalExecution("e1", "done-agent", wire.ExecCompleted),
		minimalExecution("e2", "done-agent", wire.ExecFailed),
		minimalExecution("e3", "done-agent", wire.ExecCancelled),
		minimalExecution("e4", "pending-agent", wire.ExecPending),
		minimalExecution("e5", "pending-agent", wire.ExecCompleted),
		minimalExecution("e6", "running-agent", wire.ExecRunning),
		minimalExecution("e7", "blocked-agent", wire.ExecBlocked),
	)
	live := func(agent string) bool {
		t.Helper()
		return val(s.Read().AgentHasLiveExecutions(ctx, agent)).get(t, "AgentHasLiveExecutions")
	}
	for agent, want := range map[string]bool{
		"done-agent": false, "pending-agent": true, "running-agent": true, "blocked-agent": true, "idle-agent": false,
	} {
		if got := live(agent); got != want {
			t.Errorf("AgentHasLiveExecutions(%s): got %v, want %v", agent, got, want)
		}
	}
	// The answer follows status changes.
	update(t, s, "e6", func(ctx context.Context, tx store.Tx) error {
		e, err := tx.Execution(ctx, "e6")
		if err != nil {
			return err
		}
		e.Status = wire.ExecCompleted
		return tx.UpdateExecution(ctx, e)
	})
	if live("running-agent") {
		t.Error("AgentHasLiveExecutions after its only live execution completed: got true")
	}
}
