package blackbox

import (
	"encoding/json"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

func TestGovernanceSmoke(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gov", "")
	bundle := `default_action: deny
rules:
  - id: search
    priority: 1
    when: {target: "web_*"}
    then: {decision: allow}
  - id: mail
    priority: 2
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 5m, message: "send it?"}
  - id: llm
    priority: 3
    when: {step_kind: llm_call}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m}
`
	body, _ := json.Marshal(map[string]string{"bundle": bundle})
	k.Must(204, k.Do("POST", "/v0/policies/gov", body, nil))
	id := k.CreateExecution("gov", `{}`)
	wh := a.NextWebhook()
	lease := kt.LeaseOf(wh)
	if d := a.Submit(id, lease, `{"kind":"tool_call","target":"web_search","args":{}}`); d.Decision != "proceed" || d.RuleID != "" {
		t.Fatalf("%+v", d)
	}
	if d := a.Submit(id, lease, `{"kind":"tool_call","target":"rm_rf","args":{}}`); d.Decision != "denied" || d.RuleID != "default" {
		t.Fatalf("%+v", d)
	}
	if d := a.Submit(id, lease, `{"kind":"llm_call","target":"gpt","args":{"a":1}}`); d.Decision != "proceed" {
		t.Fatalf("%+v", d)
	}
	r := a.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"llm_call","target":"gpt","args":{"a":2}}`), lease)
	if r.Status != 200 || r.Map(t)["decision"] != "rate_limited" || r.Map(t)["retry_after_ms"] == nil {
		t.Fatalf("%s", r)
	}
	d := a.Submit(id, lease, `{"kind":"tool_call","target":"send_email","args":{"to":"x"}}`)
	if d.Decision != "blocked" || d.ApprovalID == "" {
		t.Fatalf("%+v", d)
	}
	if e := k.Execution(id); e["status"] != "blocked" {
		t.Fatal(e)
	}
	r = k.Do("POST", "/v0/approvals/"+d.ApprovalID+"/grant", []byte(`{"decided_by":"bob"}`), nil)
	if r.Status != 403 {
		t.Fatal(r)
	}
	k.Must(204, k.Do("POST", "/v0/approvals/"+d.ApprovalID+"/grant", []byte(`{"decided_by":"alice","rationale":"ok"}`), nil))
	k.Must(409, k.Do("POST", "/v0/approvals/"+d.ApprovalID+"/deny", []byte(`{"decided_by":"alice"}`), nil))
	wh2 := a.NextWebhook()
	if wh2.DispatchID <= wh.DispatchID {
		t.Fatalf("dispatch ids must increase: %s then %s", wh.DispatchID, wh2.DispatchID)
	}
	l2 := kt.LeaseOf(wh2)
	a.Submit(id, l2, `{"kind":"tool_call","target":"web_search","args":{}}`)
	a.Submit(id, l2, `{"kind":"tool_call","target":"rm_rf","args":{}}`)
	a.Submit(id, l2, `{"kind":"llm_call","target":"gpt","args":{"a":1}}`)
	if d := a.Submit(id, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"x"}}`); d.Decision != "proceed" {
		t.Fatalf("%+v", d)
	}
	// Old attempt is superseded now.
	r = a.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"web_search","args":{"n":1}}`), lease)
	if r.Status != 409 || r.Code() != "lease_superseded" {
		t.Fatal(r)
	}
	t.Log(kt.Join(k.EventTypes(id)))
}
