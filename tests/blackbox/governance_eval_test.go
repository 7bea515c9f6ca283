package blackbox

import (
	"fmt"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---------------------------------------------------------------------------
// 2. Evaluation through submit (docs/protocol/steps.md §2–§4, §9, docs/protocol/governance.md §2.4)
// ---------------------------------------------------------------------------

const gvEvalBundle = `default_action: deny
rules:
  - id: search-ok
    priority: 10
    when: {target: "web_*", step_kind: tool_call}
    then: {decision: allow, reason: "searching is fine"}
  - id: no-shell
    priority: 20
    when: {targets: ["shell", "exec_*"]}
    then: {decision: deny, reason: "no shell access"}
  - id: bare-deny
    priority: 30
    when: {target: drop_table}
    then: {decision: deny}
  - id: srv-only
    priority: 40
    when:
      target: read_file
      arguments:
        path: {regex: "^/srv/"}
    then: {decision: allow}
  - id: no-forbidden-local
    priority: 50
    when: {step_kind: local, target: "forbidden_*"}
    then: {decision: deny, reason: "not this local step"}
  - id: for-other-agent
    priority: 5
    when: {agent_id: somebody-else}
    then: {decision: allow}
`

func TestGovPolicyEvaluation(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("judged", "")
	gvMustPolicy(t, k, "judged", gvEvalBundle)
	id := k.CreateExecution("judged", `{}`)
	_, l := gvDeliver(t, k, a, id)

	type stepCase struct {
		name, kind, target, args string
		want                     gvWant
		allowRule                string // rule_id of step.allowed for proceed
	}
	cases := []stepCase{
		{"allow rule", "tool_call", "web_search", `{"q":1}`, gvWant{decision: "proceed"}, "search-ok"},
		{"deny with reason", "tool_call", "shell", `{"cmd":"ls"}`, gvWant{"denied", "no shell access", "no-shell"}, ""},
		{"deny by targets glob", "tool_call", "exec_python", `{}`, gvWant{"denied", "no shell access", "no-shell"}, ""},
		{"deny without reason", "tool_call", "drop_table", `{"t":"users"}`, gvWant{"denied", "policy_denied", "bare-deny"}, ""},
		{"argument predicate matches", "tool_call", "read_file", `{"path":"/srv/data"}`, gvWant{decision: "proceed"}, "srv-only"},
		{"argument predicate fails", "tool_call", "read_file", `{"path":"/etc/passwd"}`, gvWant{"denied", "no explicit allow rule matched", "default"}, ""},
		{"args not an object", "tool_call", "read_file", `["/srv/data"]`, gvWant{"denied", "no explicit allow rule matched", "default"}, ""},
		{"step_kind excludes", "llm_call", "web_model", `{"messages":[]}`, gvWant{"denied", "no explicit allow rule matched", "default"}, ""},
		{"local unmatched under default deny", "local", "now", `null`, gvWant{decision: "proceed"}, "local"},
		{"explicit rule on local", "local", "forbidden_clock", `{}`, gvWant{"denied", "not this local step", "no-forbidden-local"}, ""},
	}
	stepIDs := map[string]string{}
	for _, c := range cases {
		seq := gvLastSeq(t, k, id)
		body := fmt.Sprintf(`{"kind":%q,"target":%q,"args":%s}`, c.kind, c.target, c.args)
		r, m := gvSubmit(t, a, id, l, body)
		gvCheck(t, c.name, m, c.want)
		sid := gvStr(t, m, "step_id")
		stepIDs[c.name] = sid
		if r.Header.Get("Rebuno-Step-Occurrence") != "0" {
			t.Fatalf("%s: occurrence header %q", c.name, r.Header.Get("Rebuno-Step-Occurrence"))
		}
		evs := gvSince(t, k, id, seq)
		st := gvStep(t, k, id, sid)
		if c.want.decision == "proceed" {
			gvExpectTypes(t, c.name, evs, "step.proposed", "step.allowed", "step.executing")
			gvPayloadKeys(t, evs[0], "step_id", "step_type", "target")
			gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "rule_id")
			if evs[1].Payload["rule_id"] != c.allowRule {
				t.Fatalf("%s: step.allowed %v", c.name, evs[1].Payload)
			}
			gvPayloadKeys(t, evs[2], "step_id", "step_type", "target")
			if string(st["status"]) != `"executing"` || st["started_at"] == nil || st["error"] != nil {
				t.Fatalf("%s: step %s", c.name, gvJSON(st))
			}
		} else {
			gvExpectTypes(t, c.name, evs, "step.proposed", "step.denied")
			gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "rule_id", "error")
			wantErr := fmt.Sprintf(`{"reason":%q,"rule_id":%q}`, c.want.reason, c.want.ruleID)
			if got := gvRawPayload(t, k, id, evs[1].Seq, "error"); got != wantErr {
				t.Fatalf("%s: step.denied error %s, want %s", c.name, got, wantErr)
			}
			if evs[1].Payload["rule_id"] != c.want.ruleID {
				t.Fatalf("%s: step.denied rule_id %v", c.name, evs[1].Payload)
			}
			if string(st["status"]) != `"denied"` || string(st["error"]) != wantErr || st["completed_at"] == nil || st["started_at"] != nil {
				t.Fatalf("%s: step %s", c.name, gvJSON(st))
			}
		}
		for _, e := range evs {
			gvStepPayload(t, e, sid, c.kind, c.target)
		}
	}
	gvWaitMetric(t, k, "rebuno_policy_decisions_total", map[string]string{"decision": "deny"}, 7)
	gvWaitMetric(t, k, "rebuno_policy_decisions_total", map[string]string{"decision": "allow"}, 3)

	// A recorded decision is never re-evaluated (docs/protocol/steps.md §2): flip the bundle,
	// then replay the same step ids (occurrence 0) and submit new ones.
	a.Complete(id, stepIDs["allow rule"], l, `{"hits":1}`)
	flipped := "default_action: allow\nrules:\n  - id: flip\n    when: {target: \"web_*\"}\n    then: {decision: deny, reason: flipped}\n"
	gvMustPolicy(t, k, "judged", flipped)
	seq := gvLastSeq(t, k, id)
	l0 := gvWithOccurrence(l, 0)
	_, m := gvSubmit(t, a, id, l0, `{"kind":"tool_call","target":"web_search","args":{"q":1}}`)
	if gvStr(t, m, "decision") != "replay" || string(m["result"]) != `{"hits":1}` || gvStr(t, m, "step_id") != stepIDs["allow rule"] {
		t.Fatalf("allowed step replay under a denying bundle: %s", gvJSON(m))
	}
	_, m = gvSubmit(t, a, id, l0, `{"kind":"tool_call","target":"shell","args":{"cmd":"ls"}}`)
	gvCheck(t, "denied replay under an allowing bundle", m, gvWant{"denied", "no shell access", "no-shell"})
	if gvStr(t, m, "step_id") != stepIDs["deny with reason"] {
		t.Fatalf("denied replay names another step: %s", gvJSON(m))
	}
	_, m = gvSubmit(t, a, id, l0, `{"kind":"tool_call","target":"drop_table","args":{"t":"users"}}`)
	gvCheck(t, "bare denied replay", m, gvWant{"denied", "policy_denied", "bare-deny"})
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("replays wrote events: %v", gvTypes(evs))
	}
	// New steps (the next occurrence) see the new bundle at once.
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{"q":1}}`)
	gvCheck(t, "new step, flipped bundle", m, gvWant{"denied", "flipped", "flip"})
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"shell","args":{"cmd":"ls"}}`)
	gvCheck(t, "new step, default allow", m, gvWant{decision: "proceed"})
	evs := gvSince(t, k, id, seq)
	if len(evs) != 5 || evs[4].Type != "step.executing" || evs[3].Payload["rule_id"] != "default" {
		t.Fatalf("events after the flip: %v", evs)
	}

	// Removing the bundle: every step is allowed as "permissive".
	gvMustPolicy(t, k, "judged", "")
	seq = gvLastSeq(t, k, id)
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"drop_table","args":{"t":"orders"}}`)
	gvCheck(t, "no bundle", m, gvWant{decision: "proceed"})
	evs = gvSince(t, k, id, seq)
	if len(evs) != 3 || evs[1].Type != "step.allowed" || evs[1].Payload["rule_id"] != "permissive" {
		t.Fatalf("permissive events: %v", evs)
	}
}
