package blackbox

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---------------------------------------------------------------------------
// 4. Rate limits (docs/protocol/governance.md §3)
// ---------------------------------------------------------------------------

func gvRateLimited(t *testing.T, what string, m map[string]json.RawMessage, reason string, retryAfter int64) {
	t.Helper()
	if gvStr(t, m, "decision") != "rate_limited" || gvStr(t, m, "reason") != reason {
		t.Fatalf("%s: %s, want rate_limited %s", what, gvJSON(m), reason)
	}
	if retryAfter == 0 {
		gvExactKeys(t, what, m, "decision", "reason")
		return
	}
	gvExactKeys(t, what, m, "decision", "reason", "retry_after_ms")
	if string(m["retry_after_ms"]) != strconv.FormatInt(retryAfter, 10) {
		t.Fatalf("%s: retry_after_ms %s, want %d", what, m["retry_after_ms"], retryAfter)
	}
}

// gvLimitedEvent checks the one step.rate_limited event of evs.
func gvLimitedEvent(t *testing.T, what string, evs []kt.Event, ruleID, reason string, retryAfter int64) string {
	t.Helper()
	gvExpectTypes(t, what, evs, "step.rate_limited")
	e := evs[0]
	if retryAfter > 0 {
		gvPayloadKeys(t, e, "step_id", "step_type", "target", "rule_id", "reason", "retry_after_ms")
		if e.Payload["retry_after_ms"] != float64(retryAfter) {
			t.Fatalf("%s: %v", what, e.Payload)
		}
	} else {
		gvPayloadKeys(t, e, "step_id", "step_type", "target", "rule_id", "reason")
	}
	if e.Payload["rule_id"] != ruleID || e.Payload["reason"] != reason {
		t.Fatalf("%s: %v", what, e.Payload)
	}
	sid, _ := e.Payload["step_id"].(string)
	if len(sid) != 64 {
		t.Fatalf("%s: step_id %v", what, e.Payload)
	}
	return sid
}

func TestGovRateLimitExecutionScope(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("limited", "")
	gvMustPolicy(t, k, "limited", "default_action: allow\nrules:\n  - id: search-quota\n    when: {target: search}\n    then:\n      decision: allow\n      rate_limit: {max_calls: 2, window: 1m}\n")
	idA := k.CreateExecution("limited", `{}`)
	_, lA := gvDeliver(t, k, a, idA)
	for i := 1; i <= 2; i++ {
		_, m := gvSubmit(t, a, idA, lA, fmt.Sprintf(`{"kind":"tool_call","target":"search","args":{"q":%d}}`, i))
		gvCheck(t, "within quota", m, gvWant{decision: "proceed"})
	}
	third := `{"kind":"tool_call","target":"search","args":{"q":3}}`
	seq := gvLastSeq(t, k, idA)
	r, m := gvSubmit(t, a, idA, lA, third)
	gvRateLimited(t, "over quota", m, "rate_limit_exceeded", 30000)
	if r.Header.Get("Rebuno-Step-Occurrence") != "" {
		t.Fatalf("rate_limited carries an occurrence header")
	}
	limitedID := gvLimitedEvent(t, "first refusal", gvSince(t, k, idA, seq), "search-quota", "rate_limit_exceeded", 30000)
	gvExpectError(t, "refused step recorded", k.Do("GET", "/v0/executions/"+idA+"/steps/"+limitedID, nil, nil), 404, "not_found", "")
	if n := gvStepCount(t, k, idA); n != 2 {
		t.Fatalf("%d steps recorded", n)
	}
	// An unrelated step is not limited.
	_, m = gvSubmit(t, a, idA, lA, `{"kind":"tool_call","target":"fetch","args":{}}`)
	gvCheck(t, "other rule", m, gvWant{decision: "proceed"})

	// Retries: same answer, refilled continuously, audited once per window.
	seq = gvLastSeq(t, k, idA)
	_, m = gvSubmit(t, a, idA, lA, third)
	gvRateLimited(t, "immediate retry", m, "rate_limit_exceeded", 30000)
	k.AdvanceClock(10 * time.Second)
	_, m = gvSubmit(t, a, idA, lA, third)
	gvRateLimited(t, "retry after 10s", m, "rate_limit_exceeded", 20000)
	if evs := gvSince(t, k, idA, seq); len(evs) != 0 {
		t.Fatalf("retries within the window were audited again: %v", gvTypes(evs))
	}

	// Another execution has its own bucket.
	idB := k.CreateExecution("limited", `{}`)
	_, lB := gvDeliver(t, k, a, idB)
	for i := 1; i <= 2; i++ {
		_, m = gvSubmit(t, a, idB, lB, fmt.Sprintf(`{"kind":"tool_call","target":"search","args":{"q":%d}}`, i))
		gvCheck(t, "second execution", m, gvWant{decision: "proceed"})
	}

	// After the refill the identical retry names the same step (the counter
	// never advanced).
	k.AdvanceClock(21 * time.Second)
	r, m = gvSubmit(t, a, idA, lA, third)
	gvCheck(t, "after refill", m, gvWant{decision: "proceed"})
	if gvStr(t, m, "step_id") != limitedID || r.Header.Get("Rebuno-Step-Occurrence") != "0" {
		t.Fatalf("retry after refill: step %s occurrence %q, refused step was %s", gvStr(t, m, "step_id"), r.Header.Get("Rebuno-Step-Occurrence"), limitedID)
	}
	evs := gvSince(t, k, idA, seq)
	gvExpectTypes(t, "admitted retry", evs, "step.proposed", "step.allowed", "step.executing")
	if evs[1].Payload["rule_id"] != "search-quota" {
		t.Fatalf("step.allowed %v", evs[1].Payload)
	}
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 3)
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_allowed"}, 0)
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_denied"}, 0)
}

func TestGovRateLimitRefillAndAudit(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("metered", `"lease_timeout_seconds":86400`)
	gvMustPolicy(t, k, "metered", `default_action: allow
rules:
  - id: fast
    when: {target: fast}
    then: {decision: allow, rate_limit: {max_calls: 3, window: 1s}}
  - id: slow
    priority: 1
    when: {target: slow}
    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m}}
`)
	id := k.CreateExecution("metered", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sub := func(target string, n int) map[string]json.RawMessage {
		_, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":{"n":%d}}`, target, n))
		return m
	}

	// retry_after_ms is the whole milliseconds until one token, rounded up:
	// 3 per second → 333.3 ms → 334.
	for n := 1; n <= 3; n++ {
		gvCheck(t, "fast", sub("fast", n), gvWant{decision: "proceed"})
	}
	gvRateLimited(t, "fast empty", sub("fast", 4), "rate_limit_exceeded", 334)
	k.AdvanceClock(100 * time.Millisecond) // 0.3 tokens → 233.3 ms
	gvRateLimited(t, "fast 0.3", sub("fast", 4), "rate_limit_exceeded", 234)
	k.AdvanceClock(233 * time.Millisecond) // 0.999 tokens → 0.33 ms
	gvRateLimited(t, "fast 0.999", sub("fast", 4), "rate_limit_exceeded", 1)
	k.AdvanceClock(time.Millisecond)
	gvCheck(t, "fast refilled", sub("fast", 4), gvWant{decision: "proceed"})
	gvRateLimited(t, "fast empty again", sub("fast", 5), "rate_limit_exceeded", 333)
	// A bucket never holds more than its capacity.
	k.AdvanceClock(time.Hour)
	for n := 5; n <= 7; n++ {
		gvCheck(t, "fast after an hour", sub("fast", n), gvWant{decision: "proceed"})
	}
	gvRateLimited(t, "capacity", sub("fast", 8), "rate_limit_exceeded", 334)

	// The audit event is written at most once per step id per window.
	gvCheck(t, "slow first", sub("slow", 1), gvWant{decision: "proceed"})
	seq := gvLastSeq(t, k, id)
	gvRateLimited(t, "slow refused", sub("slow", 2), "rate_limit_exceeded", 60000)
	k.AdvanceClock(30 * time.Second)
	gvRateLimited(t, "slow refused at 30s", sub("slow", 2), "rate_limit_exceeded", 30000)
	k.AdvanceClock(31 * time.Second) // 1.0166 tokens, clamped to the capacity 1
	gvCheck(t, "another slow call takes the refilled token", sub("slow", 3), gvWant{decision: "proceed"})
	// 61 s after the first audit: audited again.
	gvRateLimited(t, "slow refused at 61s", sub("slow", 2), "rate_limit_exceeded", 60000)
	gvRateLimited(t, "slow refused at 61s again", sub("slow", 2), "rate_limit_exceeded", 60000)
	var audits []kt.Event
	for _, e := range gvSince(t, k, id, seq) {
		if e.Type == "step.rate_limited" {
			audits = append(audits, e)
		}
	}
	if len(audits) != 2 || audits[0].Payload["step_id"] != audits[1].Payload["step_id"] ||
		audits[0].Payload["retry_after_ms"] != 60000.0 || audits[1].Payload["retry_after_ms"] != 60000.0 {
		t.Fatalf("audits of the refused slow call: %v", audits)
	}
	// fast: 4 refusals before the hour, 1 after; slow: 4.
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 9)
}

func TestGovRateLimitScopes(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	bundle := func(ruleID, perWhat string, maxCalls int) string {
		return fmt.Sprintf("default_action: allow\nrules:\n  - id: %s\n    when: {target: call}\n    then:\n      decision: allow\n      rate_limit: {max_calls: %d, window: 1h, per_what: %s}\n", ruleID, maxCalls, perWhat)
	}
	agents := map[string]*kt.Agent{}
	for name, b := range map[string]string{
		"per-agent-1": bundle("quota", "agent", 1),
		"per-agent-2": bundle("quota", "agent", 1),
		"global-1":    bundle("shared", "global", 1),
		"global-2":    bundle("shared", "global", 1),
		"global-3":    bundle("shared", "global", 2), // same id, other parameters
		"global-4":    bundle("other", "global", 1),  // other id, same parameters
	} {
		agents[name] = k.NewAgent(name, "")
		gvMustPolicy(t, k, name, b)
	}
	call := func(agent string) map[string]json.RawMessage {
		t.Helper()
		a := agents[agent]
		id := k.CreateExecution(agent, `{}`)
		_, l := gvDeliver(t, k, a, id)
		_, m := gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"call","args":{}}`)
		return m
	}
	// per_what agent: the executions of one agent share a bucket, another
	// agent with the same rule id has its own.
	gvCheck(t, "agent bucket, first execution", call("per-agent-1"), gvWant{decision: "proceed"})
	gvRateLimited(t, "agent bucket, second execution", call("per-agent-1"), "rate_limit_exceeded", 3600000)
	gvCheck(t, "another agent", call("per-agent-2"), gvWant{decision: "proceed"})
	// per_what global: shared by rules with this id and these parameters, in
	// any agent's bundle.
	gvCheck(t, "global first", call("global-1"), gvWant{decision: "proceed"})
	gvRateLimited(t, "global, other agent same rule", call("global-2"), "rate_limit_exceeded", 3600000)
	gvCheck(t, "global, other parameters", call("global-3"), gvWant{decision: "proceed"})
	gvCheck(t, "global, other rule id", call("global-4"), gvWant{decision: "proceed"})
	gvRateLimited(t, "global, first agent again", call("global-1"), "rate_limit_exceeded", 3600000)
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 3)
}

// TestGovRateLimitParameterChange: an execution rule with new parameters
// keeps its bucket, clamped to the new capacity; a global rule with new
// parameters uses a new bucket (docs/protocol/governance.md §3).
func TestGovRateLimitParameterChange(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("tuned", "")
	rules := func(execMax, globalMax int) string {
		return fmt.Sprintf(`rules:
  - id: q
    when: {target: qcall}
    then: {decision: allow, rate_limit: {max_calls: %d, window: 1h}}
  - id: g
    priority: 1
    when: {target: gcall}
    then: {decision: allow, rate_limit: {max_calls: %d, window: 1h, per_what: global}}
`, execMax, globalMax)
	}
	gvMustPolicy(t, k, "tuned", rules(5, 1))
	id := k.CreateExecution("tuned", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sub := func(target string, n int) map[string]json.RawMessage {
		_, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":{"n":%d}}`, target, n))
		return m
	}
	gvCheck(t, "q with 5", sub("qcall", 1), gvWant{decision: "proceed"}) // 4 tokens left
	gvCheck(t, "g with 1", sub("gcall", 1), gvWant{decision: "proceed"})
	gvRateLimited(t, "g spent", sub("gcall", 2), "rate_limit_exceeded", 3600000)

	gvMustPolicy(t, k, "tuned", rules(2, 2))
	// 4 tokens clamped to the new capacity 2.
	gvCheck(t, "q clamped 1", sub("qcall", 2), gvWant{decision: "proceed"})
	gvCheck(t, "q clamped 2", sub("qcall", 3), gvWant{decision: "proceed"})
	gvRateLimited(t, "q spent", sub("qcall", 4), "rate_limit_exceeded", 1800000)
	// The global rule's new parameters name a new, full bucket.
	gvCheck(t, "g with 2, new bucket", sub("gcall", 2), gvWant{decision: "proceed"})
	gvCheck(t, "g with 2, second token", sub("gcall", 3), gvWant{decision: "proceed"})
	gvRateLimited(t, "g with 2 spent", sub("gcall", 4), "rate_limit_exceeded", 1800000)
}

func TestGovRateLimitOnApprovalRule(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gated-quota", "")
	gvMustPolicy(t, k, "gated-quota", "rules:\n  - id: wire\n    when: {target: wire}\n    then:\n      decision: require_approval\n      rate_limit: {max_calls: 1, window: 1h, per_what: agent}\n")
	id1 := k.CreateExecution("gated-quota", `{}`)
	_, l1 := gvDeliver(t, k, a, id1)
	sid, aid := gvBlock(t, k, a, id1, l1, "wire", `{"amount":1}`, "wire")
	id2 := k.CreateExecution("gated-quota", `{}`)
	_, l2 := gvDeliver(t, k, a, id2)
	seq := gvLastSeq(t, k, id2)
	_, m := gvSubmit(t, a, id2, l2, `{"kind":"tool_call","target":"wire","args":{"amount":1}}`)
	gvRateLimited(t, "second approval request", m, "rate_limit_exceeded", 3600000)
	gvLimitedEvent(t, "second approval request", gvSince(t, k, id2, seq), "wire", "rate_limit_exceeded", 3600000)
	if e := k.Execution(id2); e["status"] != "running" {
		t.Fatalf("a refused approval request blocked the execution: %v", e["status"])
	}
	if got := gvListApprovals(t, k, ""); len(got) != 1 || got[0] != aid {
		t.Fatalf("approvals %v", got)
	}
	// The approved step resumes without consulting the limiter again.
	k.Must(204, gvDecide(k, aid, "grant", `{}`))
	_, l1 = gvDeliver(t, k, a, id1)
	_, m = gvSubmit(t, a, id1, l1, `{"kind":"tool_call","target":"wire","args":{"amount":1}}`)
	gvCheck(t, "approved after the quota is spent", m, gvWant{decision: "proceed"})
	if gvStr(t, m, "step_id") != sid {
		t.Fatalf("resumed step %s", gvJSON(m))
	}
}

func TestGovLimiterFault(t *testing.T) {
	bundle := `default_action: deny
rules:
  - id: open
    when: {target: "open_*"}
    then: {decision: allow, rate_limit: {max_calls: 100, window: 1m}}
  - id: open-explicit
    priority: 1
    when: {target: "explicit_*"}
    then: {decision: allow, rate_limit: {max_calls: 100, window: 1m, on_limiter_error: allow}}
  - id: closed
    priority: 2
    when: {target: "closed_*"}
    then: {decision: allow, rate_limit: {max_calls: 100, window: 1m, on_limiter_error: deny}}
  - id: closed-gate
    priority: 3
    when: {target: "gate_*"}
    then: {decision: require_approval, rate_limit: {max_calls: 100, window: 1m, on_limiter_error: deny}}
  - id: free
    priority: 4
    when: {target: free}
    then: {decision: allow}
`
	for _, fault := range []string{"error", "timeout"} {
		t.Run(fault, func(t *testing.T) {
			k := kt.Start(t, kt.Options{ManualClock: true, Env: []string{"REBUNO_TEST_LIMITER_FAULT=" + fault}})
			if !strings.Contains(k.Stderr(), "REBUNO_TEST_LIMITER_FAULT="+fault) {
				t.Fatalf("banner does not show the test setting:\n%s", k.Stderr())
			}
			a := k.NewAgent("faulty", "")
			gvMustPolicy(t, k, "faulty", bundle)
			id := k.CreateExecution("faulty", `{}`)
			_, l := gvDeliver(t, k, a, id)
			sub := func(target string) map[string]json.RawMessage {
				_, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":{}}`, target))
				return m
			}
			// Fail-open (the default and explicit allow): admitted, and the
			// step is recorded as any other.
			for _, target := range []string{"open_a", "explicit_a"} {
				seq := gvLastSeq(t, k, id)
				gvCheck(t, target, sub(target), gvWant{decision: "proceed"})
				gvExpectTypes(t, target, gvSince(t, k, id, seq), "step.proposed", "step.allowed", "step.executing")
			}
			// Fail-closed: rate_limited, rate_limiter_unavailable, no
			// retry_after_ms; audited once per window; nothing recorded.
			seq := gvLastSeq(t, k, id)
			gvRateLimited(t, "closed", sub("closed_a"), "rate_limiter_unavailable", 0)
			gvLimitedEvent(t, "closed", gvSince(t, k, id, seq), "closed", "rate_limiter_unavailable", 0)
			seq = gvLastSeq(t, k, id)
			gvRateLimited(t, "closed again", sub("closed_a"), "rate_limiter_unavailable", 0)
			if evs := gvSince(t, k, id, seq); len(evs) != 0 {
				t.Fatalf("second refusal audited: %v", gvTypes(evs))
			}
			gvRateLimited(t, "approval rule", sub("gate_a"), "rate_limiter_unavailable", 0)
			if e := k.Execution(id); e["status"] != "running" {
				t.Fatalf("fail-closed approval rule blocked the execution: %v", e["status"])
			}
			gvCheck(t, "rule without a limit", sub("free"), gvWant{decision: "proceed"})
			if n := gvStepCount(t, k, id); n != 3 {
				t.Fatalf("%d steps recorded, want 3", n)
			}
			gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_allowed"}, 2)
			gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_denied"}, 3)
			gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 0)
		})
	}
}
