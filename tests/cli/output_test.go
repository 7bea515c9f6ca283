package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// story runs an execution through every kind of line the timeline has: a
// step that takes two seconds, a crash with two steps in flight (lease
// expiry, redelivery, a replay, the re-run of a safe_to_retry orphan, the
// indeterminate outcome of an at_most_once one and the refusal to retry it),
// a failed step, a local step and the final output. The manual clock makes
// every time in it deterministic.
func story(t *testing.T, k *kt.Kernel, a *kt.Agent, id string) {
	t.Helper()
	const (
		search = `{"kind":"tool_call","target":"web_search","args":{"query":"durable agents"}}`
		fetch  = `{"kind":"tool_call","target":"fetch_page","args":{"url":"https://example.org/a"}}`
		email  = `{"kind":"tool_call","target":"send_email","args":{"to":"ops@example.org"},"idempotency":"at_most_once"}`
	)
	wh := a.NextWebhook()
	waitEvent(t, k, id, "dispatch.acked", 1)
	l1 := kt.LeaseOf(wh)
	s := a.Submit(id, l1, search)
	k.AdvanceClock(2 * time.Second)
	a.Complete(id, s.StepID, l1, `{"hits":3,"top":"https://example.org/a"}`)
	for _, body := range []string{fetch, email} {
		if d := a.Submit(id, l1, body); d.Decision != "proceed" {
			t.Fatalf("%s: %+v", body, d)
		}
	}
	// The agent dies with both steps running. The lease (120 s) lapses and
	// the kernel redelivers the same dispatch as attempt 2.
	k.AdvanceClock(121 * time.Second)
	wh2 := a.NextWebhook()
	waitEvent(t, k, id, "dispatch.acked", 2)
	l2 := kt.LeaseOf(wh2)
	if d := a.Submit(id, l2, search); d.Decision != "replay" {
		t.Fatalf("replay: %+v", d)
	}
	f := a.Submit(id, l2, fetch)
	k.AdvanceClock(300 * time.Millisecond)
	a.Complete(id, f.StepID, l2, `"<html>durable agents</html>"`)
	if d := a.Submit(id, l2, email); d.Decision != "replay" || len(d.Error) == 0 {
		t.Fatalf("indeterminate: %+v", d)
	}
	if d := a.Submit(id, l2, email); d.Decision != "denied" {
		t.Fatalf("retry refusal: %+v", d)
	}
	fl := a.Submit(id, l2, `{"kind":"tool_call","target":"flaky_api","args":{"n":1}}`)
	k.Must(200, a.Request("POST", "/v0/executions/"+id+"/steps/"+fl.StepID+"/fail", []byte(`{"error":{"message":"upstream timed out","type":"TimeoutError"}}`), l2))
	sm := a.Submit(id, l2, `{"kind":"local","target":"summarize"}`)
	a.Complete(id, sm.StepID, l2, `"durable agents survive crashes"`)
	a.Finish(id, l2, `{"answer":"durable agents survive crashes","sources":1}`)
}

// TestGoldenPlainOutput checks the exact non-terminal output of every read
// command against golden files (run `go test ./tests/cli -update` to
// rewrite them after an intended change).
func TestGoldenPlainOutput(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("researcher", `"lease_timeout_seconds":120`)

	created := cli(t, k, 0, "exec", "create", "researcher", `{"topic": "durable agents"}`, "--agent-version", "v1.2")
	id := strings.TrimSpace(created.Stdout)
	if len(id) != 36 || created.Stderr != "" {
		t.Fatalf("create printed %q / %q", created.Stdout, created.Stderr)
	}
	story(t, k, a, id)
	short := id[len(id)-8:]
	names := []string{id, "<exec-id>", short, "<exec>"}

	ev := cli(t, k, 0, "exec", "events", short)
	golden(t, "events", normalize(ev.Stdout, names...))
	if ev.Stderr != "" {
		t.Fatalf("events wrote to stderr: %s", ev.Stderr)
	}
	// Each event is one line, in order, exactly once.
	n := len(k.Events(id))
	lines := strings.Split(strings.TrimSpace(ev.Stdout), "\n")
	seqs := 0
	for _, l := range lines {
		var seq int
		if _, err := fmt.Sscanf(l, "%d", &seq); err == nil {
			seqs++
			if seq != seqs {
				t.Fatalf("line %q out of order (want seq %d)", l, seqs)
			}
		}
	}
	if seqs != n {
		t.Fatalf("timeline has %d event lines, log has %d", seqs, n)
	}

	get := cli(t, k, 0, "exec", "get", id)
	golden(t, "get", normalize(get.Stdout, names...))
	ls := cli(t, k, 0, "exec", "ls")
	golden(t, "ls", normalize(ls.Stdout, names...))
	agents := cli(t, k, 0, "agent", "ls")
	golden(t, "agent-ls", normalize(agents.Stdout, names...))
	ag := cli(t, k, 0, "agent", "get", "researcher")
	golden(t, "agent-get", normalize(ag.Stdout, names...))

	// --after-seq shows only the tail, with offsets still measured from
	// the execution's creation.
	tail := cli(t, k, 0, "exec", "events", short, "--after-seq", fmt.Sprint(n-1))
	tl := strings.Split(strings.TrimSpace(tail.Stdout), "\n")
	if len(tl) < 2 || !strings.HasPrefix(strings.TrimSpace(tl[1]), fmt.Sprint(n)) || !strings.Contains(tl[1], "+2m03s") {
		t.Fatalf("tail:\n%s", tail.Stdout)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestJSONOutput checks that --json prints the kernel's own JSON: byte for
// byte for single resources, one object per line for streams.
func TestJSONOutput(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("researcher", "")
	r := cli(t, k, 0, "exec", "create", "researcher", `{"b": 1, "a": [1.50, 2e3]}`, "--json")
	var created map[string]any
	if err := json.Unmarshal([]byte(r.Stdout), &created); err != nil || created["status"] != "running" {
		t.Fatalf("create --json: %v %q", err, r.Stdout)
	}
	id := created["id"].(string)
	// Verbatim input: key order and number literals survive.
	if !strings.Contains(r.Stdout, `"input":{"b": 1, "a": [1.50, 2e3]}`) {
		t.Fatalf("input not verbatim: %s", r.Stdout)
	}
	story(t, k, a, id)

	want := k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil)).Body
	got := cli(t, k, 0, "exec", "get", id[30:], "--json")
	if got.Stdout != string(want) {
		t.Fatalf("exec get --json:\n got %s\nwant %s", got.Stdout, want)
	}

	evs := cli(t, k, 0, "exec", "events", id, "--json")
	lines := strings.Split(strings.TrimRight(evs.Stdout, "\n"), "\n")
	log := k.Events(id)
	if len(lines) != len(log) {
		t.Fatalf("events --json: %d lines, %d events", len(lines), len(log))
	}
	for i, l := range lines {
		var e kt.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Seq != int64(i+1) || e.Type != log[i].Type || e.ExecutionID != id {
			t.Fatalf("line %d: %v %s", i, err, l)
		}
	}
	// The tail of a finished execution: the same lines, from the stream.
	watch := cli(t, k, 0, "exec", "watch", id, "--json")
	if watch.Stdout != evs.Stdout {
		t.Fatalf("watch --json differs from events --json:\n%s\n---\n%s", watch.Stdout, evs.Stdout)
	}

	page := cli(t, k, 0, "exec", "ls", "--json", "--limit", "1")
	var p struct {
		Executions []map[string]any `json:"executions"`
		NextCursor *string          `json:"next_cursor"`
	}
	if err := json.Unmarshal([]byte(page.Stdout), &p); err != nil || len(p.Executions) != 1 || p.NextCursor != nil {
		t.Fatalf("ls --json: %v %s", err, page.Stdout)
	}
	// --all streams executions one per line.
	second := k.CreateExecution("researcher", `null`)
	all := cli(t, k, 0, "exec", "ls", "--json", "--all", "--limit", "1")
	rows := strings.Split(strings.TrimSpace(all.Stdout), "\n")
	if len(rows) != 2 || !strings.Contains(rows[0], second) || !strings.Contains(rows[1], id) {
		t.Fatalf("ls --all --json:\n%s", all.Stdout)
	}
	// One page of one: the next page is offered on stderr, from the cursor after it.
	first := cli(t, k, 0, "exec", "ls", "--limit", "1")
	if strings.Count(first.Stdout, "\n") != 1 || !strings.Contains(first.Stderr, "more: rebuno exec ls --cursor "+second+" --limit 1") {
		t.Fatalf("ls --limit 1: %s", first)
	}

	ag := cli(t, k, 0, "agent", "ls", "--json")
	wantAgents := k.Must(200, k.Do("GET", "/v0/agents", nil, nil)).Body
	if ag.Stdout != string(wantAgents) || strings.Contains(ag.Stdout, a.Secret) {
		t.Fatalf("agent ls --json: %s", ag.Stdout)
	}
	one := cli(t, k, 0, "agent", "get", "researcher", "--json")
	if !json.Valid([]byte(one.Stdout)) || !strings.Contains(one.Stdout, `"id":"researcher"`) {
		t.Fatalf("agent get --json: %s", one.Stdout)
	}

	cancel := cli(t, k, 0, "exec", "cancel", second, "--json")
	var c map[string]any
	if err := json.Unmarshal([]byte(cancel.Stdout), &c); err != nil || c["status"] != "cancelled" || c["failure_reason"] != "client_cancelled" {
		t.Fatalf("cancel --json: %v %s", err, cancel.Stdout)
	}
}

// TestCreateInputSources reads the input from an argument, stdin and a file.
func TestCreateInputSources(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	k.NewAgent("researcher", "")
	input := func(id string) string {
		b := k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil)).Body
		var e struct {
			Input json.RawMessage `json:"input"`
		}
		json.Unmarshal(b, &e)
		return string(e.Input)
	}
	none := strings.TrimSpace(cli(t, k, 0, "exec", "create", "researcher").Stdout)
	if got := input(none); got != `{}` {
		t.Fatalf("default input %s", got)
	}
	r := runIn(t, ` {"from": "stdin"} `+"\n", []string{"REBUNO_URL=" + k.URL}, "exec", "create", "researcher", "-")
	if r.Code != 0 || input(strings.TrimSpace(r.Stdout)) != `{"from": "stdin"}` {
		t.Fatalf("stdin input: %s", r)
	}
	file := t.TempDir() + "/in.json"
	writeFile(t, file, "[1, 2,\n 3]\n")
	f := strings.TrimSpace(cli(t, k, 0, "exec", "create", "researcher", "@"+file).Stdout)
	if got := input(f); got != "[1, 2,\n 3]" {
		t.Fatalf("file input %q", got)
	}
}

// TestTerminalOutput runs commands on a pseudo-terminal: aligned tables
// with a header, relative times and colour; NO_COLOR turns colour off.
func TestTerminalOutput(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	k.NewAgent("researcher", "")
	id := k.CreateExecution("researcher", `{}`)
	out := runPTY(t, []string{"REBUNO_URL=" + k.URL, "TERM=xterm-256color"}, "exec", "ls")
	if !strings.Contains(out, "\x1b[") {
		t.Fatalf("no colour on a terminal: %q", out)
	}
	plain := stripANSI(out)
	if !regexpMatch(`ID\s+AGENT\s+STATUS\s+CREATED\s+UPDATED`, plain) ||
		!regexpMatch(id[28:]+`\s+researcher\s+running\s+(just now|\ds ago)`, plain) {
		t.Fatalf("terminal table:\n%s", plain)
	}
	nc := runPTY(t, []string{"REBUNO_URL=" + k.URL, "TERM=xterm-256color", "NO_COLOR=1"}, "exec", "get", id)
	if strings.Contains(nc, "\x1b[3") || !strings.Contains(nc, "status         running") {
		t.Fatalf("NO_COLOR output: %q", nc)
	}
	created := stripANSI(runPTY(t, []string{"REBUNO_URL=" + k.URL, "TERM=xterm-256color"}, "exec", "create", "researcher"))
	if !strings.Contains(created, "Created execution") || !strings.Contains(created, "follow it: rebuno exec watch") {
		t.Fatalf("create on a terminal: %q", created)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := writeFileErr(path, s); err != nil {
		t.Fatal(err)
	}
}

var _ = bytes.Equal
