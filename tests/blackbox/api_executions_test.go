package blackbox

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- docs/protocol/executions.md §1, §2, §3: the Execution ----

// TestAPIExecutionShape checks the Execution JSON across its life: the
// fields present, their types, the presence rules and verbatim input and
// output.
func TestAPIExecutionShape(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("shaper", "")

	// Without input, agent_version, key or on_behalf_of.
	r := k.Must(201, k.Do("POST", "/v0/executions", []byte(`{"agent_id":"shaper"}`), nil))
	hsWantJSON(t, r)
	e := r.Map(t)
	if got, want := strings.Join(hsKeys(e), ","), "agent_id,created_at,id,input,resource_keys,status,updated_at"; got != want {
		t.Fatalf("minimal execution keys %s, want %s: %s", got, want, r.Body)
	}
	id := e["id"].(string)
	if !hsUUIDv7.MatchString(id) || e["agent_id"] != "shaper" || e["status"] != "running" || e["input"] != nil {
		t.Fatalf("created execution %s", r.Body)
	}
	if rk, ok := e["resource_keys"].([]any); !ok || len(rk) != 0 {
		t.Fatalf("resource_keys must be [] : %s", r.Body)
	}
	if raw := hsRawMembers(t, r.Body); string(raw["input"]) != "null" || string(raw["resource_keys"]) != "[]" {
		t.Fatalf("input/resource_keys raw %s", r.Body)
	}
	c := hsWantTime(t, "created_at", e["created_at"])
	u := hsWantTime(t, "updated_at", e["updated_at"])
	if u.Before(c) {
		t.Fatalf("updated_at before created_at: %s", r.Body)
	}
	if got := k.Execution(id); got["status"] != "running" || got["id"] != id {
		t.Fatalf("read back %v", got)
	}

	// Every optional field set; input kept byte for byte.
	input := `{ "b" : [1.0, 1E2, -0, 12345678901234567890], "a" : "\u00e9\n" }`
	body := `{"agent_id":"shaper","input":` + input + `,"agent_version":"v-1.2","on_behalf_of":"alice@example.com","idempotency_key":"shape-key-1"}`
	r = k.Must(201, k.Do("POST", "/v0/executions", []byte(body), nil))
	full := r.Map(t)
	fid := full["id"].(string)
	if got, want := strings.Join(hsKeys(full), ","), "agent_id,agent_version,created_at,id,idempotency_key,input,on_behalf_of,resource_keys,status,updated_at"; got != want {
		t.Fatalf("full execution keys %s, want %s", got, want)
	}
	if full["agent_version"] != "v-1.2" || full["on_behalf_of"] != "alice@example.com" || full["idempotency_key"] != "shape-key-1" {
		t.Fatalf("optional fields %s", r.Body)
	}
	for _, b := range [][]byte{r.Body, k.Must(200, k.Do("GET", "/v0/executions/"+fid, nil, nil)).Body} {
		if raw := hsRawMembers(t, b); string(raw["input"]) != input {
			t.Fatalf("input not verbatim: %s", raw["input"])
		}
	}
	// The created log: execution.created carries agent_version (docs/protocol/events.md §2).
	evs := k.Events(fid)
	if len(evs) < 3 || evs[0].Type != "execution.created" || evs[1].Type != "execution.started" || evs[2].Type != "dispatch.queued" {
		t.Fatalf("create log %v", k.EventTypes(fid))
	}
	if evs[0].Payload["agent_version"] != "v-1.2" || evs[0].Payload["status"] != "pending" || evs[1].Payload["status"] != "running" {
		t.Fatalf("create payloads %+v", evs[:2])
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) || ev.ExecutionID != fid {
			t.Fatalf("event %d: %+v", i, ev)
		}
		hsWantTime(t, "occurred_at", ev.OccurredAt)
	}

	// Completed: output present (verbatim), failure_reason absent.
	run := hsStartRunFor(t, k, a, id)
	output := `{"z": 1, "a": [true , null]}`
	k.Must(204, a.Request("POST", "/v0/executions/"+id+"/complete", []byte(`{"output":`+output+`}`), run.lease))
	r = k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil))
	raw := hsRawMembers(t, r.Body)
	if string(raw["output"]) != output || string(raw["status"]) != `"completed"` {
		t.Fatalf("completed execution %s", r.Body)
	}
	if _, ok := raw["failure_reason"]; ok {
		t.Fatalf("failure_reason on a completed execution: %s", r.Body)
	}
	done := r.Map(t)
	if hsWantTime(t, "updated_at", done["updated_at"]).Before(c) {
		t.Fatalf("updated_at not moved: %s", r.Body)
	}

	// Completed with no output: "output": null is present.
	nid := k.CreateExecution("shaper", `null`)
	nrun := hsStartRunFor(t, k, a, nid)
	k.Must(204, a.Request("POST", "/v0/executions/"+nid+"/complete", []byte(`{}`), nrun.lease))
	if raw := hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+nid, nil, nil)).Body); string(raw["output"]) != "null" {
		t.Fatalf("completed without output: output %q", raw["output"])
	}

	// Cancelled: failure_reason, no output.
	k.Must(204, k.Do("POST", "/v0/executions/"+fid+"/cancel", nil, nil))
	r = k.Must(200, k.Do("GET", "/v0/executions/"+fid, nil, nil))
	cancelled := r.Map(t)
	if cancelled["status"] != "cancelled" || cancelled["failure_reason"] != "client_cancelled" {
		t.Fatalf("cancelled %s", r.Body)
	}
	if _, ok := cancelled["output"]; ok {
		t.Fatalf("output on a cancelled execution: %s", r.Body)
	}
	// Cancel again, cancel unknown (docs/protocol/executions.md §7).
	hsWantErr(t, k.Do("POST", "/v0/executions/"+fid+"/cancel", nil, nil), 409, "execution_terminal")
	hsWantErr(t, k.Do("POST", "/v0/executions/0190a5b0-0000-7000-8000-000000000001/cancel", nil, nil), 404, "not_found")

	// Failed by the agent: failure_reason is its text; no null anywhere.
	xid := k.CreateExecution("shaper", `1`)
	xrun := hsStartRunFor(t, k, a, xid)
	k.Must(204, a.Request("POST", "/v0/executions/"+xid+"/fail", []byte(`{"error":"tool broke"}`), xrun.lease))
	for _, eid := range []string{id, nid, fid, xid} {
		b := k.Must(200, k.Do("GET", "/v0/executions/"+eid, nil, nil)).Body
		for key, v := range hsRawMembers(t, b) {
			if string(v) == "null" && key != "input" && key != "output" {
				t.Fatalf("%s is null: %s", key, b)
			}
		}
	}
	if x := k.Execution(xid); x["status"] != "failed" || x["failure_reason"] != "tool broke" {
		t.Fatalf("failed execution %v", x)
	}
}

// hsStartRunFor waits for the delivery of an execution created elsewhere.
func hsStartRunFor(t *testing.T, k *kt.Kernel, a *kt.Agent, id string) hsRun {
	t.Helper()
	wh := hsWebhookFor(t, a, id)
	hsWaitEvent(t, k, id, "dispatch.acked")
	return hsRun{k: k, a: a, id: id, lease: kt.LeaseOf(wh)}
}

// ---- docs/protocol/executions.md §4 ----

type hsPage struct {
	Executions []map[string]any `json:"executions"`
	NextCursor *string          `json:"next_cursor"`
}

func hsList(t *testing.T, k *kt.Kernel, query string) (hsPage, []string) {
	t.Helper()
	r := k.Must(200, k.Do("GET", "/v0/executions?"+query, nil, nil))
	hsWantJSON(t, r)
	var p hsPage
	r.JSON(t, &p)
	if p.Executions == nil {
		t.Fatalf("executions missing or null: %s", r.Body)
	}
	var ids []string
	for _, e := range p.Executions {
		ids = append(ids, e["id"].(string))
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] >= ids[i-1] {
			t.Fatalf("list %q not newest first: %v", query, ids)
		}
	}
	return p, ids
}

// TestAPIExecutionList covers paging (default and clamped limits, next_cursor
// present if and only if more exist, keyset stability) and the filters.
func TestAPIExecutionList(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	k.NewAgent("lister", "")
	k.NewAgent("other", "")

	p, _ := hsList(t, k, "")
	if len(p.Executions) != 0 || p.NextCursor != nil {
		t.Fatalf("empty list %+v", p)
	}
	if r := k.Do("GET", "/v0/executions", nil, nil); !strings.Contains(string(r.Body), `"executions":[]`) {
		t.Fatalf("empty list must be []: %s", r.Body)
	}

	// 205 executions of lister, created concurrently in 5 streams.
	const n = 205
	created := make(chan string, n)
	errs := make(chan string, n)
	for w := 0; w < 5; w++ {
		go func() {
			for i := 0; i < n/5; i++ {
				req, _ := http.NewRequest("POST", k.URL+"/v0/executions", strings.NewReader(`{"agent_id":"lister"}`))
				req.Header.Set("Content-Type", "application/json")
				k.Authorize(req)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err.Error()
					continue
				}
				var e struct{ ID string }
				json.NewDecoder(resp.Body).Decode(&e)
				resp.Body.Close()
				if resp.StatusCode != 201 {
					errs <- resp.Status
					continue
				}
				created <- e.ID
			}
		}()
	}
	all := map[string]bool{}
	for len(all) < n {
		select {
		case id := <-created:
			all[id] = true
		case e := <-errs:
			t.Fatalf("create: %s", e)
		case <-time.After(60 * time.Second):
			t.Fatalf("only %d creates", len(all))
		}
	}
	// Three of the other agent, created after all of lister's.
	var others []string
	for i := 0; i < 3; i++ {
		others = append(others, k.CreateExecution("other", `null`))
	}

	// Default limit 50; limit=0 and an empty value are the same.
	for _, q := range []string{"", "limit=0", "limit=", "agent_id=lister"} {
		p, ids := hsList(t, k, q)
		if len(ids) != 50 || p.NextCursor == nil || *p.NextCursor != ids[49] {
			t.Fatalf("%q: %d items, next_cursor %v", q, len(ids), p.NextCursor)
		}
	}
	// Newest first: the other agent's (created last) lead the unfiltered list.
	_, ids := hsList(t, k, "limit=3")
	for i, id := range ids {
		if id != others[2-i] {
			t.Fatalf("newest first: got %v, created %v", ids, others)
		}
	}
	// Clamped to 200.
	for _, q := range []string{"limit=100000", "limit=200", "limit=9223372036854775807"} {
		p, ids := hsList(t, k, q+"&agent_id=lister")
		if len(ids) != 200 || p.NextCursor == nil {
			t.Fatalf("%q: %d items", q, len(ids))
		}
	}
	p, ids = hsList(t, k, "limit=1")
	if len(ids) != 1 || p.NextCursor == nil {
		t.Fatalf("limit=1: %+v", p)
	}

	// Keyset paging: walk lister's executions 60 at a time while new ones
	// are created; the walk sees exactly the original set.
	var walked []string
	cursor := ""
	for page := 0; ; page++ {
		q := "agent_id=lister&limit=60"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		p, ids := hsList(t, k, q)
		walked = append(walked, ids...)
		if page == 0 {
			for i := 0; i < 2; i++ {
				k.CreateExecution("lister", `"late"`)
			}
		}
		if p.NextCursor == nil {
			if len(ids) != n-60*page {
				t.Fatalf("last page has %d", len(ids))
			}
			break
		}
		if *p.NextCursor != ids[len(ids)-1] {
			t.Fatalf("next_cursor %s is not the last id %s", *p.NextCursor, ids[len(ids)-1])
		}
		cursor = *p.NextCursor
	}
	if len(walked) != n {
		t.Fatalf("walked %d executions, want %d", len(walked), n)
	}
	for _, id := range walked {
		if !all[id] {
			t.Fatalf("walk returned %s, created after the first page or never", id)
		}
		delete(all, id)
	}

	// next_cursor present if and only if more exist, at the exact edge.
	p, ids = hsList(t, k, "agent_id=other&limit=3")
	if len(ids) != 3 || p.NextCursor != nil {
		t.Fatalf("exactly limit items left: next_cursor %v", p.NextCursor)
	}
	p, ids = hsList(t, k, "agent_id=other&limit=2")
	if len(ids) != 2 || p.NextCursor == nil || *p.NextCursor != others[1] {
		t.Fatalf("agent_id=other&limit=2: %v %v", ids, p.NextCursor)
	}
	p, ids = hsList(t, k, "agent_id=other&limit=2&cursor="+strings.ToUpper(*p.NextCursor))
	if len(ids) != 1 || ids[0] != others[0] || p.NextCursor != nil {
		t.Fatalf("second page %v %v", ids, p.NextCursor)
	}

	// Filters.
	k.Must(204, k.Do("POST", "/v0/executions/"+others[1]+"/cancel", nil, nil))
	_, ids = hsList(t, k, "status=cancelled")
	if len(ids) != 1 || ids[0] != others[1] {
		t.Fatalf("status=cancelled: %v", ids)
	}
	_, ids = hsList(t, k, "status=running&agent_id=other")
	if len(ids) != 2 || ids[0] != others[2] || ids[1] != others[0] {
		t.Fatalf("status=running&agent_id=other: %v", ids)
	}
	for _, q := range []string{"status=completed", "status=blocked", "status=pending", "status=failed", "agent_id=nobody", "agent_id=" + strings.Repeat("x", 128)} {
		if _, ids := hsList(t, k, q); len(ids) != 0 {
			t.Fatalf("%s: %v", q, ids)
		}
	}
	for _, e := range p.Executions {
		if e["agent_id"] != "other" {
			t.Fatalf("agent filter leaked %v", e)
		}
	}
	// Unknown query parameters are ignored.
	if _, ids := hsList(t, k, "agent_id=other&colour=blue&page=7"); len(ids) != 3 {
		t.Fatalf("unknown parameters changed the answer: %v", ids)
	}
}
