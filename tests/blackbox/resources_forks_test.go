package blackbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- forks ----

// TestForkCopies: which steps a fork copies (docs/protocol/forks.md §2), their ids and shared
// bodies returned verbatim, the fork's first dispatch replaying them, and a
// step that waited for approval asking again.
func TestForkCopies(t *testing.T) {
	k, a := rfStartKernel(t, "")
	gvMustPolicy(t, k, "coder", "default_action: allow\nrules:\n"+
		"  - id: no-rm\n    when: {target: rm}\n    then: {decision: deny, reason: \"never rm\"}\n"+
		"  - id: ask\n    priority: 1\n    when: {target: \"deploy*\"}\n    then: {decision: require_approval}\n")
	r := rfBegin(t, k, a, `{"task" : "copies"}`)
	r.register(rfWS(false, 1))
	search := r.live("tool_call", "search", ` { "q" :  "x" } `, nil, ent("workspace", 1, false))
	r.done(search, ` {"hits" : [1, 2.50]} `, "")
	boom := r.live("tool_call", "boom", `[1,  2]`, nil, ent("workspace", 2, false))
	if d := r.doneAs(r.lease, boom, "fail", `{"message" : "kaput"}`, ""); d.Decision != "recorded" {
		t.Fatal(d.raw)
	}
	rm := r.submit(rfStepBody("tool_call", "rm", `{"p":"/"}`))
	if rm.Decision != "denied" || rm.Reason != "never rm" || rm.RuleID != "no-rm" {
		t.Fatalf("rm: %s", rm.raw)
	}
	now := r.live("local", "now", "", ws, ent("workspace", 3, true))
	r.done(now, `"2026-12-02"`, `,"captures":[`+rfCap("workspace", 3, "C3")+`]`)
	slow := r.live("tool_call", "slow", "", nil, ent("workspace", 4, false))
	// deploy0 waits for approval, is granted, resumes (a live start) and
	// succeeds.
	d0 := r.submit(rfStepBody("tool_call", "deploy0", `{"v":0}`))
	if d0.Decision != "blocked" {
		t.Fatalf("deploy0: %s", d0.raw)
	}
	k.Must(204, gvDecide(k, d0.ApprovalID, "grant", `{"decided_by":"ops"}`))
	r1 := rfAttach(t, k, a, r.id)
	if id := r1.live("tool_call", "deploy0", `{"v":0}`, nil, ent("workspace", 5, false)); id != d0.StepID {
		t.Fatalf("resumed deploy0 is %s, want %s", id, d0.StepID)
	}
	r1.done(d0.StepID, `"deployed"`, "")
	d1 := r1.submit(rfStepBody("tool_call", "deploy1", ""))
	if d1.Decision != "blocked" {
		t.Fatalf("deploy1: %s", d1.raw)
	}
	// A human denial: the step is denied with the rationale as its reason.
	k.Must(204, gvDecide(k, d1.ApprovalID, "deny", `{"decided_by":"ops","rationale":"no"}`))
	r2 := rfAttach(t, k, a, r.id)
	if d := r2.submit(rfStepBody("tool_call", "deploy1", "")); d.Decision != "denied" {
		t.Fatalf("deploy1 after deny: %s", d.raw)
	}
	d2 := r2.submit(rfStepBody("tool_call", "deploy2", ""))
	if d2.Decision != "blocked" {
		t.Fatalf("deploy2: %s", d2.raw)
	}
	// Fork while blocked: deploy2 awaits approval and slow is executing;
	// neither is copied. Forks at every seq follow the model.
	last := r.lastSeq()
	var f *rfFork
	for s := int64(1); s <= last; s++ {
		f = rfForkAt(t, k, r.id, s)
	}
	if !slices.Equal(f.targets, []string{"search", "boom", "rm", "now", "deploy0", "deploy1"}) {
		t.Fatalf("copied %v", f.targets)
	}
	var allowed []string
	for _, ev := range f.evs {
		if ev.Type == evAllowed && ev.Payload["approval_id"] != nil {
			allowed = append(allowed, ev.Payload["approval_id"].(string))
		}
	}
	if !slices.Equal(allowed, []string{d0.ApprovalID}) {
		t.Fatalf("copied step.allowed approval ids %v, want the source's %s", allowed, d0.ApprovalID)
	}
	// The fork's first dispatch: same ids, replays with the stored bodies
	// verbatim, denials replay denied, the rest runs live and asks again;
	// no approval of the source is copied.
	fr := rfAttach(t, k, a, f.id)
	if v := fr.register(rfWS(false, 1)); v.Covered || v.CheckpointRef != "C3" || v.Generation != 6 {
		t.Fatalf("fork view %+v", v)
	}
	body := func(d rfDecision) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		json.Unmarshal(d.raw, &m)
		return m
	}
	if d := fr.submit(rfStepBody("tool_call", "search", ` { "q" :  "x" } `)); d.Decision != "replay" || d.StepID != f.stepIDs[search] ||
		string(body(d)["result"]) != `{"hits" : [1, 2.50]}` {
		t.Fatalf("search replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "boom", `[1,  2]`)); d.Decision != "replay" || string(body(d)["error"]) != `{"message" : "kaput"}` {
		t.Fatalf("boom replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "rm", `{"p":"/"}`)); d.Decision != "denied" || d.Reason != "never rm" || d.RuleID != "no-rm" ||
		d.StepID != f.stepIDs[rm.StepID] {
		t.Fatalf("rm replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("local", "now", "", "workspace")); d.Decision != "replay" || d.StepID != f.stepIDs[now] {
		t.Fatalf("now replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "deploy0", `{"v":0}`)); d.Decision != "replay" || string(d.Result) != `"deployed"` {
		t.Fatalf("deploy0 replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "deploy1", "")); d.Decision != "denied" || d.Reason != "no" {
		t.Fatalf("deploy1 replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "slow", "")); d.Decision != "proceed" || d.StepID == slow {
		t.Fatalf("slow in the fork: %s", d.raw)
	}
	fd2 := fr.submit(rfStepBody("tool_call", "deploy2", ""))
	if fd2.Decision != "blocked" || fd2.ApprovalID == d2.ApprovalID {
		t.Fatalf("deploy2 in the fork asks again: %s", fd2.raw)
	}
	if got := gvListApprovals(t, k, "?execution_id="+f.id); !slices.Equal(got, []string{fd2.ApprovalID}) {
		t.Fatalf("the fork's approvals %v, want only its own %s", got, fd2.ApprovalID)
	}
	// GET of a copied step shows the shared bodies verbatim.
	var st rfStep
	k.Must(200, k.Do("GET", "/v0/executions/"+f.id+"/steps/"+f.stepIDs[search], nil, nil)).JSON(t, &st)
	if string(st["args"]) != `{ "q" :  "x" }` || string(st["result"]) != `{"hits" : [1, 2.50]}` || st.str("execution_id") != f.id {
		t.Fatalf("copied step %v", st)
	}
	k.Must(200, k.Do("GET", "/v0/executions/"+f.id+"/steps/"+f.stepIDs[boom], nil, nil)).JSON(t, &st)
	if string(st["args"]) != `[1,  2]` || string(st["error"]) != `{"message" : "kaput"}` {
		t.Fatalf("copied step %v", st)
	}
	// Cancel the source: deploy2 is denied by the clean-up and slow is
	// cancelled; forks after that still copy neither.
	k.Must(204, k.Do("POST", r.path("/cancel"), nil, nil))
	last = r.lastSeq()
	fc := rfForkAt(t, k, r.id, last)
	if !slices.Equal(fc.targets, []string{"search", "boom", "rm", "now", "deploy0", "deploy1"}) {
		t.Fatalf("copied after cancel %v", fc.targets)
	}
	fcr := rfAttach(t, k, a, fc.id)
	if d := fcr.submit(rfStepBody("tool_call", "deploy2", "")); d.Decision != "blocked" {
		t.Fatalf("deploy2 in the fork of the cancelled source: %s", d.raw)
	}
}

// TestForkRetention: retention keeps a source while a fork reads it in
// place, and deletes it after that fork; a fork of that fork (a copy, since
// its source reads in place) keeps the shared bodies readable and survives
// both (docs/protocol/forks.md §2, docs/protocol/executions.md §10).
func TestForkRetention(t *testing.T) {
	k, a := rfStartKernel(t, `"lease_timeout_seconds":86400`, "--retention", "1h", "--cleanup-interval", "1m",
		"--dispatch-max-attempts", "1000")
	p := rfBegin(t, k, a, "1")
	s1 := p.live("tool_call", "s1", ` {"a" : 1} `, nil)
	p.done(s1, ` [ "r1" ,1.0] `, "")
	s2 := p.live("tool_call", "s2", `"x"`, nil)
	if d := p.doneAs(p.lease, s2, "fail", ` {"message":"e" } `, ""); d.Decision != "recorded" {
		t.Fatal(d.raw)
	}
	p.finish()
	bodies := func(id string) []string {
		var out []string
		for _, st := range rfSteps(t, k, id) {
			out = append(out, string(st["args"])+"|"+string(st["result"])+string(st["error"]))
		}
		return out
	}
	want := []string{`{"a" : 1}|[ "r1" ,1.0]`, `"x"|{"message":"e" }`}
	if got := bodies(p.id); !slices.Equal(got, want) {
		t.Fatalf("source bodies %q", got)
	}
	// A witness as old as p, which nothing reads: its deletion shows that
	// a retention pass has run.
	witness := k.CreateExecution(a.ID, `null`)
	k.Must(204, k.Do("POST", "/v0/executions/"+witness+"/cancel", nil, nil))
	k.AdvanceClock(40 * time.Minute)
	f := rfForkAt(t, k, p.id, p.lastSeq())
	fr := rfAttach(t, k, a, f.id)
	g := rfForkAt(t, k, f.id, 4+2*4)
	fr.finish()
	k.AdvanceClock(30 * time.Minute) // p and the witness are 70 minutes old, f 30
	gone := func(id string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for k.Do("GET", "/v0/executions/"+id, nil, nil).Status != 404 {
			if time.Now().After(deadline) {
				t.Fatalf("execution %s was not deleted", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// f reads p's history in place, so retention keeps p while f lives.
	gone(witness)
	k.Must(200, k.Do("GET", "/v0/executions/"+p.id+"/steps/"+s1, nil, nil))
	if got := bodies(f.id); !slices.Equal(got, want) {
		t.Fatalf("fork bodies %q", got)
	}
	k.AdvanceClock(time.Hour)
	gone(f.id)
	gone(p.id)
	rfErr(t, "source step", k.Do("GET", "/v0/executions/"+p.id+"/steps/"+s1, nil, nil), 404, "not_found", "")
	if got := bodies(g.id); !slices.Equal(got, want) {
		t.Fatalf("fork-of-fork bodies after both deletions %q", got)
	}
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+g.id+"/steps/"+g.stepIDs[f.stepIDs[s1]], nil, nil))
	if !bytes.Contains(resp.Body, []byte(`{"a" : 1}`)) || !bytes.Contains(resp.Body, []byte(`[ "r1" ,1.0]`)) {
		t.Fatalf("fork-of-fork step %s", resp.Body)
	}
	// The fork of the fork replays them.
	gr := rfAttach(t, k, a, g.id)
	if d := gr.submit(rfStepBody("tool_call", "s1", `{"a":1}`)); d.Decision != "replay" || string(d.Result) != `[ "r1" ,1.0]` {
		t.Fatalf("replay in the fork of the fork: %s", d.raw)
	}
}

// TestForkErrors: docs/protocol/forks.md §5 and the Idempotency-Key of a fork.
func TestForkErrors(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Token: "tok-" + strings.Repeat("x", 20)})
	a := rfNewAgent(t, k, "coder", "")
	r := rfBegin(t, k, a, "1")
	last := r.lastSeq()
	path := r.path("/fork")
	for what, body := range map[string]string{
		"at_seq 0":          `{"at_seq":0}`,
		"at_seq negative":   `{"at_seq":-3}`,
		"at_seq past last":  fmt.Sprintf(`{"at_seq":%d}`, last+1),
		"at_seq missing":    `{}`,
		"at_seq null":       `{"at_seq":null}`,
		"at_seq string":     `{"at_seq":"3"}`,
		"at_seq fraction":   `{"at_seq":1.5}`,
		"session":           `{"at_seq":1,"session":"s1"}`,
		"session object":    `{"at_seq":1,"session":{}}`,
		"policy_bundle":     `{"at_seq":1,"policy_bundle":"default_action: deny"}`,
		"unknown field":     `{"at_seq":1,"fork_seq":1}`,
		"not an object":     `[1]`,
		"huge at_seq":       `{"at_seq":99999999999999999999}`,
		"session not empty": `{"at_seq":1,"session":" "}`,
	} {
		msg := ""
		if strings.HasPrefix(what, "at_seq") && what != "at_seq missing" && what != "at_seq null" && what != "at_seq string" && what != "at_seq fraction" {
			msg = fmt.Sprintf("at_seq must be between 1 and %d", last)
		}
		rfErr(t, what, k.Do("POST", path, []byte(body), nil), 400, "validation_error", msg)
	}
	// Absent, null and "" session and policy_bundle are accepted.
	k.Must(201, k.Do("POST", path, []byte(`{"at_seq":1,"session":null,"policy_bundle":""}`), nil))
	k.Must(201, k.Do("POST", path, []byte(`{"at_seq":1,"session":""}`), nil))
	rfErr(t, "unknown source", k.Do("POST", "/v0/executions/0190aaaa-0000-7000-8000-000000000000/fork", []byte(`{"at_seq":1}`), nil), 404, "not_found", "")
	rfErr(t, "bad source id", k.Do("POST", "/v0/executions/nope/fork", []byte(`{"at_seq":1}`), nil), 400, "validation_error", "")
	// No bearer, a wrong one, and an agent signature are 401.
	req, _ := http.NewRequest("POST", k.URL+path, strings.NewReader(`{"at_seq":1}`))
	resp, err := k.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("fork without a bearer: %d", resp.StatusCode)
	}
	if resp := k.Do("POST", path, []byte(`{"at_seq":1}`), map[string]string{"Authorization": "Bearer wrong"}); resp.Status != 401 {
		t.Fatalf("fork with a wrong bearer: %s", resp)
	}
	// Idempotency-Key: same body → the same fork (201); different body →
	// 409; the key is scoped to the source.
	key := map[string]string{"Idempotency-Key": "fork-key-1"}
	f1 := k.Must(201, k.Do("POST", path, []byte(`{"at_seq":2}`), key)).Map(t)
	f2 := k.Must(201, k.Do("POST", path, []byte(` { "at_seq" : 2 } `), key)).Map(t)
	if f1["id"] != f2["id"] || f1["fork_seq"] != 2.0 || f1["idempotency_key"] != "fork-key-1" || f2["idempotency_key"] != "fork-key-1" {
		t.Fatalf("idempotent fork: %v then %v", f1["id"], f2["id"])
	}
	rfErr(t, "key reused with another body", k.Do("POST", path, []byte(`{"at_seq":3}`), key), 409, "conflict",
		"conflict: idempotency key reused with a different body")
	rfErr(t, "bad key", k.Do("POST", path, []byte(`{"at_seq":3}`), map[string]string{"Idempotency-Key": "a b"}), 400, "validation_error", "")
	other := rfBegin(t, k, a, "2")
	f3 := k.Must(201, k.Do("POST", other.path("/fork"), []byte(`{"at_seq":2}`), key)).Map(t)
	if f3["id"] == f1["id"] || f3["forked_from"] != other.id {
		t.Fatalf("the key is scoped to the source: %v", f3)
	}
	if n := len(rfForkIDs(t, k, r.id, "")); n != 3 {
		t.Fatalf("forks of the source: %d, want 3", n)
	}
	// The source's agent is gone: 409.
	g := rfNewAgent(t, k, "gone", "")
	gr := rfBegin(t, k, g, "1")
	gr.finish()
	k.Must(204, k.Do("DELETE", "/v0/agents/gone", nil, nil))
	rfErr(t, "agent gone", k.Do("POST", gr.path("/fork"), []byte(`{"at_seq":1}`), nil), 409, "conflict", `conflict: agent \"gone\" is not registered`)
}

// TestForksList: direct forks only, newest first, paged like the execution
// list (docs/protocol/forks.md §3).
func TestForksList(t *testing.T) {
	k, a := rfStartKernel(t, "")
	other := rfNewAgent(t, k, "other", "")
	r := rfBegin(t, k, a, "1")
	r.finish()
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, k.Must(201, k.Do("POST", r.path("/fork"), []byte(`{"at_seq":2}`), nil)).Map(t)["id"].(string))
	}
	g := k.Must(201, k.Do("POST", "/v0/executions/"+ids[0]+"/fork", []byte(`{"at_seq":1}`), nil)).Map(t)["id"].(string)
	var page struct {
		Executions []map[string]any `json:"executions"`
		NextCursor *string          `json:"next_cursor"`
	}
	k.Must(200, k.Do("GET", r.path("/forks?limit=2"), nil, nil)).JSON(t, &page)
	if len(page.Executions) != 2 || page.Executions[0]["id"] != ids[2] || page.Executions[1]["id"] != ids[1] ||
		page.NextCursor == nil || *page.NextCursor != ids[1] {
		t.Fatalf("first page %+v", page)
	}
	page.NextCursor = nil
	k.Must(200, k.Do("GET", r.path("/forks?limit=2&cursor="+ids[1]), nil, nil)).JSON(t, &page)
	if len(page.Executions) != 1 || page.Executions[0]["id"] != ids[0] || page.NextCursor != nil {
		t.Fatalf("second page %+v", page)
	}
	if got := rfForkIDs(t, k, r.id, ""); !slices.Equal(got, []string{ids[2], ids[1], ids[0]}) {
		t.Fatalf("all forks %v", got)
	}
	if got := rfForkIDs(t, k, ids[0], ""); !slices.Equal(got, []string{g}) {
		t.Fatalf("forks of a fork %v", got)
	}
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+g+"/forks", nil, nil))
	if !bytes.Contains(resp.Body, []byte(`"executions":[]`)) || bytes.Contains(resp.Body, []byte("next_cursor")) {
		t.Fatalf("no forks: %s", resp.Body)
	}
	// Owner's HMAC reads it; another agent cannot.
	k.Must(200, a.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}))
	rfErr(t, "another agent", other.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}), 403, "forbidden", "")
	rfErr(t, "unknown", k.Do("GET", "/v0/executions/0190aaaa-0000-7000-8000-000000000000/forks", nil, nil), 404, "not_found", "")
	rfErr(t, "bad cursor", k.Do("GET", r.path("/forks?cursor=x"), nil, nil), 400, "validation_error", "")
	rfErr(t, "negative limit", k.Do("GET", r.path("/forks?limit=-1"), nil, nil), 400, "validation_error", "")
	// The source's own log is untouched by its forks.
	rfWantTypes(t, "source", k.Events(r.id), evCreated, evStarted, evQueued, evAcked, evCompleted)
}
