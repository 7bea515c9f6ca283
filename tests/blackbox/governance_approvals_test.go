package blackbox

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---------------------------------------------------------------------------
// 3. Approvals (docs/protocol/steps.md §4, docs/protocol/governance.md §1, docs/protocol/dispatch.md §12)
// ---------------------------------------------------------------------------

const gvApprovalBundle = `default_action: allow
rules:
  - id: mail-needs-ok
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config:
        approvers: [alice, bob]
        timeout: 5m
        message: "Send this mail?"
  - id: pay-needs-ok
    priority: 1
    when: {target: pay}
    then: {decision: require_approval}
`

// gvBlock submits a gated step and checks the blocked answer and the four
// events of docs/protocol/events.md §3; it returns the step id and the approval id.
func gvBlock(t *testing.T, k *kt.Kernel, a *kt.Agent, id string, l kt.Lease, target, args, ruleID string) (string, string) {
	t.Helper()
	seq := gvLastSeq(t, k, id)
	r, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":%s}`, target, args))
	gvCheck(t, "gated submit", m, gvWant{decision: "blocked"})
	if r.Header.Get("Rebuno-Step-Occurrence") == "" {
		t.Fatalf("blocked answer without occurrence header")
	}
	sid, aid := gvStr(t, m, "step_id"), gvStr(t, m, "approval_id")
	evs := gvSince(t, k, id, seq)
	gvExpectTypes(t, "require_approval", evs, "step.proposed", "step.awaiting_approval", "approval.requested", "execution.blocked")
	gvStepPayload(t, evs[0], sid, "tool_call", target)
	gvStepPayload(t, evs[1], sid, "tool_call", target)
	gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "rule_id")
	if evs[1].Payload["rule_id"] != ruleID {
		t.Fatalf("step.awaiting_approval %v", evs[1].Payload)
	}
	gvPayloadKeys(t, evs[2], "approval_id", "step_id", "execution_id", "status")
	if evs[2].Payload["approval_id"] != aid || evs[2].Payload["step_id"] != sid || evs[2].Payload["execution_id"] != id || evs[2].Payload["status"] != "pending" {
		t.Fatalf("approval.requested %v", evs[2].Payload)
	}
	gvPayloadKeys(t, evs[3], "execution_id", "status")
	if evs[3].Payload["execution_id"] != id || evs[3].Payload["status"] != "blocked" {
		t.Fatalf("execution.blocked %v", evs[3].Payload)
	}
	if st := k.Execution(id)["status"]; st != "blocked" {
		t.Fatalf("execution %v after require_approval", st)
	}
	if st := gvStep(t, k, id, sid); string(st["status"]) != `"awaiting_approval"` || st["error"] != nil || st["started_at"] != nil {
		t.Fatalf("gated step %s", gvJSON(st))
	}
	return sid, aid
}

// gvResolved checks the four events of a grant, deny or expiry (docs/protocol/events.md §3) after
// seq and returns the new dispatch id.
func gvResolved(t *testing.T, k *kt.Kernel, id string, seq int64, first string, sid, aid, target string) (string, []kt.Event) {
	t.Helper()
	evs := gvSince(t, k, id, seq)
	if len(evs) < 4 {
		t.Fatalf("after the decision: %v", gvTypes(evs))
	}
	second := "step.denied"
	if first == "approval.granted" {
		second = "step.allowed"
	}
	gvExpectTypes(t, "decision", evs[:4], first, second, "execution.resumed", "dispatch.queued")
	for _, e := range evs[4:] {
		if e.Type != "dispatch.acked" {
			t.Fatalf("unexpected event after the decision: %v", gvTypes(evs))
		}
	}
	if evs[0].Payload["approval_id"] != aid || evs[0].Payload["step_id"] != sid || evs[0].Payload["execution_id"] != id {
		t.Fatalf("%s %v", first, evs[0].Payload)
	}
	gvStepPayload(t, evs[1], sid, "tool_call", target)
	if first == "approval.granted" {
		gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "approval_id")
		if evs[1].Payload["approval_id"] != aid {
			t.Fatalf("step.allowed %v", evs[1].Payload)
		}
	} else {
		gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "error")
	}
	if evs[2].Payload["execution_id"] != id || evs[2].Payload["status"] != "running" {
		t.Fatalf("execution.resumed %v", evs[2].Payload)
	}
	gvPayloadKeys(t, evs[3], "dispatch_id", "execution_id", "status", "attempt")
	d, _ := evs[3].Payload["dispatch_id"].(string)
	if !gvUUIDv7.MatchString(d) || evs[3].Payload["status"] != "pending" || evs[3].Payload["attempt"] != 0.0 {
		t.Fatalf("dispatch.queued %v", evs[3].Payload)
	}
	return d, evs
}

func TestGovApprovalGrant(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)
	id := k.CreateExecution("gate", `{}`)
	wh1, l1 := gvDeliver(t, k, a, id)

	_, m := gvSubmit(t, a, id, l1, `{"kind":"tool_call","target":"web_search","args":{"q":"x"}}`)
	gvCheck(t, "before the gate", m, gvWant{decision: "proceed"})
	s1 := gvStr(t, m, "step_id")
	s2, aid := gvBlock(t, k, a, id, l1, "send_email", `{"to":"x@example.com"}`, "mail-needs-ok")

	ap := gvApproval(t, k, aid)
	want := map[string]string{"id": `"` + aid + `"`, "step_id": `"` + s2 + `"`, "execution_id": `"` + id + `"`, "agent_id": `"gate"`,
		"kind": `"tool_call"`, "target": `"send_email"`, "status": `"pending"`, "approvers": `["alice","bob"]`, "message": `"Send this mail?"`}
	for key, v := range want {
		if string(ap[key]) != v {
			t.Fatalf("approval %s = %s, want %s", key, ap[key], v)
		}
	}
	for _, absent := range []string{"decided_by", "decided_at", "rationale"} {
		if _, ok := ap[absent]; ok {
			t.Fatalf("pending approval has %s: %s", absent, ap[absent])
		}
	}
	if d := gvTime(t, ap["timeout_at"]).Sub(gvTime(t, ap["created_at"])); d != 5*time.Minute {
		t.Fatalf("timeout_at - created_at = %s", d)
	}

	// While blocked (docs/protocol/dispatch.md §12, docs/protocol/steps.md §3, §10, docs/protocol/executions.md §5): the released dispatch gets the
	// answers of a blocked execution and writes nothing.
	seq := gvLastSeq(t, k, id)
	r, m := gvSubmit(t, a, id, l1, `{"kind":"tool_call","target":"web_fetch","args":{}}`)
	gvCheck(t, "new step while blocked", m, gvWant{decision: "execution_blocked"})
	if r.Header.Get("Rebuno-Step-Occurrence") != "" {
		t.Fatalf("execution_blocked carries an occurrence header")
	}
	_, m = gvSubmit(t, a, id, gvWithOccurrence(l1, 0), `{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`)
	gvCheck(t, "gated step again", m, gvWant{decision: "blocked"})
	if gvStr(t, m, "approval_id") != aid || gvStr(t, m, "step_id") != s2 {
		t.Fatalf("replay of the gated step: %s", gvJSON(m))
	}
	k.Must(204, a.Request("POST", "/v0/executions/"+id+"/heartbeat", nil, l1))
	gvExpectError(t, "complete of the gated step",
		a.Request("POST", "/v0/executions/"+id+"/steps/"+s2+"/complete", []byte(`{"result":1}`), l1), 409, "conflict", "conflict: step is not executing")
	gvExpectError(t, "execution complete while blocked",
		a.Request("POST", "/v0/executions/"+id+"/complete", []byte(`{"output":1}`), l1), 409, "conflict", "conflict: execution is blocked awaiting approval")
	gvExpectError(t, "execution fail while blocked",
		a.Request("POST", "/v0/executions/"+id+"/fail", []byte(`{"error":"x"}`), l1), 409, "conflict", "conflict: execution is blocked awaiting approval")
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("blocked answers wrote events: %v", gvTypes(evs))
	}
	// A step started before the block can still be completed.
	if d := a.Complete(id, s1, l1, `{"hits":2}`); d.Decision != "recorded" {
		t.Fatalf("complete while blocked: %+v", d)
	}
	gvExpectTypes(t, "complete while blocked", gvSince(t, k, id, seq), "step.succeeded")

	// The released dispatch is never redelivered, even long after its lease.
	seq = gvLastSeq(t, k, id)
	k.AdvanceClock(130 * time.Second)
	a.NoWebhook(1500 * time.Millisecond)
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("released dispatch: %v", gvTypes(evs))
	}

	// Approvers check (docs/protocol/governance.md §1.3): exact, case-sensitive membership.
	for by, body := range map[string]string{"mallory": `{"decided_by":"mallory"}`, "Alice": `{"decided_by":"Alice"}`, "": `{}`} {
		for _, verb := range []string{"grant", "deny"} {
			gvExpectError(t, verb+" by "+by, gvDecide(k, aid, verb, body), 403, "forbidden",
				fmt.Sprintf("forbidden: %q is not an approver for this approval", by))
		}
	}
	if got := gvListApprovals(t, k, ""); len(got) != 1 || got[0] != aid {
		t.Fatalf("pending approvals %v", got)
	}
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("refused decisions wrote events: %v", gvTypes(evs))
	}

	// Grant.
	k.Must(204, gvDecide(k, aid, "grant", `{"decided_by":"alice","rationale":"looks fine"}`))
	d2, evs := gvResolved(t, k, id, seq, "approval.granted", s2, aid, "send_email")
	gvPayloadKeys(t, evs[0], "approval_id", "step_id", "execution_id", "status", "decided_by", "rationale")
	if evs[0].Payload["status"] != "granted" || evs[0].Payload["decided_by"] != "alice" || evs[0].Payload["rationale"] != "looks fine" {
		t.Fatalf("approval.granted %v", evs[0].Payload)
	}
	if d2 <= wh1.DispatchID {
		t.Fatalf("new dispatch %s not after %s", d2, wh1.DispatchID)
	}
	ap = gvApproval(t, k, aid)
	if string(ap["status"]) != `"granted"` || string(ap["decided_by"]) != `"alice"` || string(ap["rationale"]) != `"looks fine"` || ap["decided_at"] == nil {
		t.Fatalf("granted approval %s", gvJSON(ap))
	}
	if st := gvStep(t, k, id, s2); string(st["status"]) != `"allowed"` {
		t.Fatalf("granted step %s", st["status"])
	}
	if st := k.Execution(id)["status"]; st != "running" {
		t.Fatalf("execution %v after grant", st)
	}
	gvExpectError(t, "grant twice", gvDecide(k, aid, "grant", `{"decided_by":"bob"}`), 409, "conflict", "conflict: approval is not pending")
	gvExpectError(t, "deny after grant", gvDecide(k, aid, "deny", `{"decided_by":"bob"}`), 409, "conflict", "conflict: approval is not pending")
	if got := gvListApprovals(t, k, ""); len(got) != 0 {
		t.Fatalf("pending approvals after grant %v", got)
	}

	// The new dispatch arrives; the old attempt is superseded.
	wh2, l2 := gvDeliver(t, k, a, id)
	if wh2.DispatchID != d2 || wh2.DispatchAttempt != 1 {
		t.Fatalf("webhook after grant: %s", wh2.Body)
	}
	seq = gvLastSeq(t, k, id)
	gvExpectError(t, "old submit", a.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"web_search","args":{"q":"y"}}`), l1), 409, "lease_superseded", "lease superseded")
	gvExpectError(t, "old heartbeat", a.Request("POST", "/v0/executions/"+id+"/heartbeat", nil, l1), 409, "lease_superseded", "")
	gvExpectError(t, "old complete", a.Request("POST", "/v0/executions/"+id+"/complete", []byte(`{"output":1}`), l1), 409, "lease_superseded", "")
	gvExpectError(t, "old replay of the gated step", a.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`), gvWithOccurrence(l1, 0)), 409, "lease_superseded", "")
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("superseded requests wrote events: %v", gvTypes(evs))
	}

	// The handler replays: the first step replays, the gated one proceeds
	// exactly once.
	_, m = gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"web_search","args":{"q":"x"}}`)
	if gvStr(t, m, "decision") != "replay" || string(m["result"]) != `{"hits":2}` {
		t.Fatalf("replay after grant: %s", gvJSON(m))
	}
	_, m = gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`)
	gvCheck(t, "approved step", m, gvWant{decision: "proceed"})
	if gvStr(t, m, "step_id") != s2 {
		t.Fatalf("approved step id %s", gvJSON(m))
	}
	evs = gvSince(t, k, id, seq)
	gvExpectTypes(t, "resumed approved step", evs, "step.executing")
	gvStepPayload(t, evs[0], s2, "tool_call", "send_email")
	a.Complete(id, s2, l2, `{"sent":true}`)
	_, m = gvSubmit(t, a, id, gvWithOccurrence(l2, 0), `{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`)
	if gvStr(t, m, "decision") != "replay" || string(m["result"]) != `{"sent":true}` {
		t.Fatalf("approved step after completion: %s", gvJSON(m))
	}
	a.Finish(id, l2, `"done"`)
	if e := k.Execution(id); e["status"] != "completed" {
		t.Fatalf("execution %v", e)
	}
	if n := strings.Count(kt.Join(k.EventTypes(id)), "approval."); n != 2 {
		t.Fatalf("approval events: %v", k.EventTypes(id))
	}
	gvWaitMetric(t, k, "rebuno_approval_outcomes_total", map[string]string{"outcome": "granted"}, 1)
}

func TestGovApprovalDeny(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--approval-timeout", "30s"}})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)

	// A rule without approval_config: anyone decides, the kernel's timeout.
	id := k.CreateExecution("gate", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sid, aid := gvBlock(t, k, a, id, l, "pay", `{"amount":5}`, "pay-needs-ok")
	ap := gvApproval(t, k, aid)
	if string(ap["approvers"]) != `[]` || ap["message"] != nil {
		t.Fatalf("approval without config: %s", gvJSON(ap))
	}
	if d := gvTime(t, ap["timeout_at"]).Sub(gvTime(t, ap["created_at"])); d != 30*time.Second {
		t.Fatalf("default approval timeout %s", d)
	}
	seq := gvLastSeq(t, k, id)
	k.Must(204, gvDecide(k, aid, "deny", `{}`))
	_, evs := gvResolved(t, k, id, seq, "approval.denied", sid, aid, "pay")
	gvPayloadKeys(t, evs[0], "approval_id", "step_id", "execution_id", "status")
	if evs[0].Payload["status"] != "denied" {
		t.Fatalf("approval.denied %v", evs[0].Payload)
	}
	if got := gvRawPayload(t, k, id, evs[1].Seq, "error"); got != `{"reason":"approval_denied"}` {
		t.Fatalf("step.denied error %s", got)
	}
	st := gvStep(t, k, id, sid)
	if string(st["status"]) != `"denied"` || string(st["error"]) != `{"reason":"approval_denied"}` || st["completed_at"] == nil {
		t.Fatalf("denied step %s", gvJSON(st))
	}
	ap = gvApproval(t, k, aid)
	if string(ap["status"]) != `"denied"` || ap["decided_at"] == nil || ap["decided_by"] != nil || ap["rationale"] != nil {
		t.Fatalf("denied approval %s", gvJSON(ap))
	}
	gvExpectError(t, "grant after deny", gvDecide(k, aid, "grant", `{}`), 409, "conflict", "")
	_, l2 := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"pay","args":{"amount":5}}`)
	gvCheck(t, "replay of a denied approval", m, gvWant{"denied", "approval_denied", ""})
	a.Finish(id, l2, `null`)

	// With approvers and a rationale, the rationale is the reason.
	id2 := k.CreateExecution("gate", `{}`)
	_, l = gvDeliver(t, k, a, id2)
	sid, aid = gvBlock(t, k, a, id2, l, "send_email", `{"to":"y"}`, "mail-needs-ok")
	seq = gvLastSeq(t, k, id2)
	k.Must(204, gvDecide(k, aid, "deny", `{"decided_by":"bob","rationale":"not today"}`))
	_, evs = gvResolved(t, k, id2, seq, "approval.denied", sid, aid, "send_email")
	if evs[0].Payload["decided_by"] != "bob" || evs[0].Payload["rationale"] != "not today" {
		t.Fatalf("approval.denied %v", evs[0].Payload)
	}
	if got := gvRawPayload(t, k, id2, evs[1].Seq, "error"); got != `{"reason":"not today"}` {
		t.Fatalf("step.denied error %s", got)
	}
	_, l2 = gvDeliver(t, k, a, id2)
	_, m = gvSubmit(t, a, id2, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"y"}}`)
	gvCheck(t, "replay of a denied mail", m, gvWant{"denied", "not today", ""})
	// The handler goes on after the denial: a new step is evaluated again.
	_, m = gvSubmit(t, a, id2, l2, `{"kind":"tool_call","target":"web_search","args":{}}`)
	gvCheck(t, "after denial", m, gvWant{decision: "proceed"})
	gvWaitMetric(t, k, "rebuno_approval_outcomes_total", map[string]string{"outcome": "denied"}, 2)

	// Bad input on the decision routes.
	gvExpectError(t, "unknown approval", gvDecide(k, "01900000-0000-7000-8000-000000000000", "grant", `{}`), 404, "not_found", "")
	gvExpectError(t, "get unknown approval", k.Do("GET", "/v0/approvals/01900000-0000-7000-8000-000000000000", nil, nil), 404, "not_found", "")
	gvExpectError(t, "bad approval id", gvDecide(k, "not-a-uuid", "grant", `{}`), 400, "validation_error", "")
	gvExpectError(t, "unknown field", gvDecide(k, aid, "deny", `{"decided_by":"bob","why":"x"}`), 400, "validation_error", "")
	gvExpectError(t, "long decided_by", gvDecide(k, aid, "deny", fmt.Sprintf(`{"decided_by":%q}`, strings.Repeat("b", 257))), 400, "validation_error", "")
	gvExpectError(t, "long rationale", gvDecide(k, aid, "deny", fmt.Sprintf(`{"rationale":%q}`, strings.Repeat("r", 4097))), 400, "validation_error", "")
	gvExpectError(t, "empty body", gvDecide(k, aid, "deny", ``), 400, "validation_error", "")
}

func TestGovApprovalExpiry(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--approval-timeout", "45s"}})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)
	id := k.CreateExecution("gate", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sid, aid := gvBlock(t, k, a, id, l, "pay", `{"amount":7}`, "pay-needs-ok")

	k.AdvanceClock(44 * time.Second)
	if ap := gvApproval(t, k, aid); string(ap["status"]) != `"pending"` {
		t.Fatalf("approval expired early: %s", gvJSON(ap))
	}
	seq := gvLastSeq(t, k, id)
	start := time.Now()
	k.AdvanceClock(2 * time.Second)
	gvWaitEvent(t, k, id, 2*time.Second, func(e kt.Event) bool { return e.Type == "approval.expired" })
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("expiry took %s", el)
	}
	_, evs := gvResolved(t, k, id, seq, "approval.expired", sid, aid, "pay")
	gvPayloadKeys(t, evs[0], "approval_id", "step_id", "execution_id", "status", "rationale")
	if evs[0].Payload["status"] != "expired" || evs[0].Payload["rationale"] != "timeout" {
		t.Fatalf("approval.expired %v", evs[0].Payload)
	}
	if got := gvRawPayload(t, k, id, evs[1].Seq, "error"); got != `{"reason":"approval_timeout"}` {
		t.Fatalf("step.denied error %s", got)
	}
	ap := gvApproval(t, k, aid)
	if string(ap["status"]) != `"expired"` || string(ap["rationale"]) != `"timeout"` || ap["decided_at"] == nil || ap["decided_by"] != nil {
		t.Fatalf("expired approval %s", gvJSON(ap))
	}
	if e := k.Execution(id); e["status"] != "running" {
		t.Fatalf("expiry must resume, not fail: %v", e)
	}
	gvExpectError(t, "grant after expiry", gvDecide(k, aid, "grant", `{}`), 409, "conflict", "conflict: approval is not pending")
	_, l2 := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"pay","args":{"amount":7}}`)
	gvCheck(t, "replay of an expired approval", m, gvWant{"denied", "approval_timeout", ""})
	if got := gvListApprovals(t, k, "?status=expired"); len(got) != 1 || got[0] != aid {
		t.Fatalf("expired approvals %v", got)
	}
	gvWaitMetric(t, k, "rebuno_approval_outcomes_total", map[string]string{"outcome": "expired"}, 1)
}

func TestGovApprovalList(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)
	var ids, execs []string
	for i := 0; i < 4; i++ {
		id := k.CreateExecution("gate", `{}`)
		_, l := gvDeliver(t, k, a, id)
		_, aid := gvBlock(t, k, a, id, l, "pay", fmt.Sprintf(`{"n":%d}`, i), "pay-needs-ok")
		ids, execs = append(ids, aid), append(execs, id)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("approval ids not increasing: %v", ids)
		}
	}
	k.Must(204, gvDecide(k, ids[1], "grant", `{}`))
	k.Must(204, gvDecide(k, ids[2], "deny", `{}`))

	check := func(query string, want ...string) {
		t.Helper()
		if want == nil {
			want = []string{}
		}
		if got := gvListApprovals(t, k, query); !gvSameList(got, want) {
			t.Fatalf("approvals%s = %v, want %v", query, got, want)
		}
	}
	check("", ids[0], ids[3])
	check("?status=pending", ids[0], ids[3])
	check("?status=granted", ids[1])
	check("?status=denied", ids[2])
	check("?status=expired")
	check("?execution_id="+execs[3], ids[3])
	check("?execution_id="+strings.ToUpper(execs[3]), ids[3])
	check("?status=granted&execution_id=" + execs[0])
	check("?after="+ids[0], ids[3])
	check("?after=" + ids[3])
	check("?limit=1", ids[0])
	check("?limit=0", ids[0], ids[3])
	check("?limit=5000", ids[0], ids[3])
	for _, q := range []string{"?status=open", "?limit=-1", "?limit=x", "?execution_id=nope", "?after=123", "?status=pending&status=granted"} {
		gvExpectError(t, q, k.Do("GET", "/v0/approvals"+q, nil, nil), 400, "validation_error", "")
	}
	// GET returns any status; the body shape is the Approval of docs/protocol/governance.md §1.1.
	ap := gvApproval(t, k, ids[2])
	if string(ap["status"]) != `"denied"` || string(ap["approvers"]) != "[]" {
		t.Fatalf("approval %s", gvJSON(ap))
	}
	gvExpectError(t, "bad id", k.Do("GET", "/v0/approvals/xyz", nil, nil), 400, "validation_error", "")
	if ap := gvApproval(t, k, strings.ToUpper(ids[0])); string(ap["id"]) != `"`+ids[0]+`"` {
		t.Fatalf("uppercase id lookup: %s", gvJSON(ap))
	}
}

func TestGovApprovalCancelAndDeadline(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--deadline-timeout", "2m"}})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)

	// Cancel: docs/protocol/executions.md §9 expires the pending approval, denies its step and cancels
	// the step still executing, after the terminal event.
	id := k.CreateExecution("gate", `{}`)
	_, l := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{}}`)
	open := gvStr(t, m, "step_id")
	sid, aid := gvBlock(t, k, a, id, l, "send_email", `{"to":"z"}`, "mail-needs-ok")
	seq := gvLastSeq(t, k, id)
	k.Must(204, k.Do("POST", "/v0/executions/"+id+"/cancel", nil, nil))
	evs := gvSince(t, k, id, seq)
	gvExpectTypes(t, "cancel while blocked", evs, "execution.cancelled", "approval.expired", "step.denied", "step.cancelled")
	if evs[1].Payload["rationale"] != "execution_cancelled" || evs[1].Payload["approval_id"] != aid {
		t.Fatalf("approval.expired %v", evs[1].Payload)
	}
	gvStepPayload(t, evs[2], sid, "tool_call", "send_email")
	if got := gvRawPayload(t, k, id, evs[2].Seq, "error"); got != `{"reason":"execution_cancelled"}` {
		t.Fatalf("step.denied error %s", got)
	}
	gvStepPayload(t, evs[3], open, "tool_call", "web_search")
	ap := gvApproval(t, k, aid)
	if string(ap["status"]) != `"expired"` || string(ap["rationale"]) != `"execution_cancelled"` {
		t.Fatalf("approval after cancel %s", gvJSON(ap))
	}
	gvExpectError(t, "grant after cancel", gvDecide(k, aid, "grant", `{"decided_by":"alice"}`), 409, "conflict", "")
	gvExpectError(t, "deny after cancel", gvDecide(k, aid, "deny", `{"decided_by":"alice"}`), 409, "conflict", "")
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{"n":2}}`)
	if gvStr(t, m, "decision") != "execution_terminal" {
		t.Fatalf("submit after cancel %s", gvJSON(m))
	}
	if n := len(gvSince(t, k, id, seq)); n != 4 {
		t.Fatalf("events appended after the terminal transaction: %v", k.EventTypes(id))
	}

	// Deadline: the same clean-up with cause deadline_exceeded.
	id = k.CreateExecution("gate", `{}`)
	_, l = gvDeliver(t, k, a, id)
	sid, aid = gvBlock(t, k, a, id, l, "send_email", `{"to":"w"}`, "mail-needs-ok")
	k.AdvanceClock(time.Minute) // neither the 2m deadline nor the approval's 5m
	seq = gvLastSeq(t, k, id)
	k.AdvanceClock(61 * time.Second)
	e := gvWaitEvent(t, k, id, 5*time.Second, func(e kt.Event) bool { return e.Type == "execution.cancelled" })
	if e.Payload["reason"] != "deadline_exceeded" {
		t.Fatalf("execution.cancelled %v", e.Payload)
	}
	evs = gvSince(t, k, id, seq)
	gvExpectTypes(t, "deadline while blocked", evs, "execution.cancelled", "approval.expired", "step.denied")
	if evs[1].Payload["rationale"] != "deadline_exceeded" {
		t.Fatalf("approval.expired %v", evs[1].Payload)
	}
	if got := gvRawPayload(t, k, id, evs[2].Seq, "error"); got != `{"reason":"deadline_exceeded"}` {
		t.Fatalf("step.denied error %s", got)
	}
	gvStepPayload(t, evs[2], sid, "tool_call", "send_email")
	if ap := gvApproval(t, k, aid); string(ap["rationale"]) != `"deadline_exceeded"` {
		t.Fatalf("approval after deadline %s", gvJSON(ap))
	}
}

// TestGovApprovalRaces fires grant, deny, (every other round) cancel and a
// clock advance past the approval's timeout at the same moment: exactly one
// decides the approval, the others are refused with 409, and the log holds
// exactly one decision.
func TestGovApprovalRaces(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	// A day-long lease: the clock jumps of the races never reclaim a dispatch.
	a := k.NewAgent("racer", `"lease_timeout_seconds":86400`)
	gvMustPolicy(t, k, "racer", "rules:\n  - id: hold\n    when: {target: hold}\n    then:\n      decision: require_approval\n      approval_config: {timeout: 1m}\n")
	wins := map[string]int{}
	const rounds = 24
	for round := 0; round < rounds; round++ {
		id := k.CreateExecution("racer", fmt.Sprintf(`{"round":%d}`, round))
		_, l := gvDeliver(t, k, a, id)
		_, aid := gvBlock(t, k, a, id, l, "hold", `{}`, "hold")
		withCancel := round%2 == 0

		type answer struct {
			status int
			body   []byte
		}
		answers := map[string]answer{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		startGun := make(chan struct{})
		fire := func(name, path, body string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-startGun
				req, _ := http.NewRequest("POST", k.URL+path, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				k.Authorize(req)
				resp, err := gvHTTP.Do(req)
				if err != nil {
					mu.Lock()
					answers[name] = answer{status: -1, body: []byte(err.Error())}
					mu.Unlock()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				answers[name] = answer{resp.StatusCode, b}
				mu.Unlock()
			}()
		}
		fire("grant", "/v0/approvals/"+aid+"/grant", `{"decided_by":"g"}`)
		fire("deny", "/v0/approvals/"+aid+"/deny", `{"decided_by":"d","rationale":"raced"}`)
		fire("clock", "/v0/test/clock", `{"advance":"61s"}`)
		if withCancel {
			fire("cancel", "/v0/executions/"+id+"/cancel", ``)
		}
		close(startGun)
		wg.Wait()

		if answers["clock"].status != 200 {
			t.Fatalf("round %d: clock %d %s", round, answers["clock"].status, answers["clock"].body)
		}
		if withCancel && answers["cancel"].status != 204 {
			t.Fatalf("round %d: cancel %d %s", round, answers["cancel"].status, answers["cancel"].body)
		}
		winners := 0
		for _, verb := range []string{"grant", "deny"} {
			ans := answers[verb]
			switch ans.status {
			case 204:
				winners++
			case 409:
				var env struct{ Code string }
				json.Unmarshal(ans.body, &env)
				if env.Code != "conflict" && env.Code != "execution_terminal" {
					t.Fatalf("round %d: %s refused with %s", round, verb, ans.body)
				}
			default:
				t.Fatalf("round %d: %s answered %d %s", round, verb, ans.status, ans.body)
			}
		}
		if winners > 1 {
			t.Fatalf("round %d: grant and deny both won", round)
		}
		// Without a human winner the expiry (or the cancel) decides; expiry
		// runs in the background, within 2 s.
		var ap map[string]json.RawMessage
		deadline := time.Now().Add(3 * time.Second)
		for {
			ap = gvApproval(t, k, aid)
			if string(ap["status"]) != `"pending"` {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: approval still pending (answers %v)", round, answers)
			}
			time.Sleep(5 * time.Millisecond)
		}
		status := strings.Trim(string(ap["status"]), `"`)
		switch {
		case answers["grant"].status == 204 && status != "granted",
			answers["deny"].status == 204 && status != "denied",
			winners == 0 && status != "expired":
			t.Fatalf("round %d: approval %s but answers grant=%d deny=%d", round, status, answers["grant"].status, answers["deny"].status)
		}
		winner := status
		if status == "expired" {
			winner = "expired:" + strings.Trim(string(ap["rationale"]), `"`)
			if r := string(ap["rationale"]); r != `"timeout"` && !(withCancel && r == `"execution_cancelled"`) {
				t.Fatalf("round %d: expired with rationale %s", round, r)
			}
		}
		wins[winner]++

		// Exactly one decision in the log; the log ends with the clean-up
		// when the execution was cancelled.
		evs := k.Events(id)
		decisions := 0
		for _, e := range evs {
			switch e.Type {
			case "approval.granted", "approval.denied", "approval.expired":
				decisions++
				if e.Payload["approval_id"] != aid || e.Payload["status"] != status {
					t.Fatalf("round %d: %s %v, approval is %s", round, e.Type, e.Payload, status)
				}
			}
		}
		if decisions != 1 {
			t.Fatalf("round %d: %d decisions in %v", round, decisions, gvTypes(evs))
		}
		if withCancel {
			for i, e := range evs {
				if e.Type != "execution.cancelled" {
					continue
				}
				for _, after := range evs[i+1:] {
					switch after.Type {
					case "approval.expired", "step.denied", "step.cancelled":
					default:
						t.Fatalf("round %d: %s after the terminal event: %v", round, after.Type, gvTypes(evs))
					}
				}
			}
			if e := k.Execution(id); e["status"] != "cancelled" {
				t.Fatalf("round %d: execution %v", round, e["status"])
			}
		}
	}
	t.Logf("winners over %d rounds: %v", rounds, wins)
}
