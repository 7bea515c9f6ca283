package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// The source execution of the fork tests, driven over the agent's raw HTTP
// routes. Its log, numbered as the assertions and golden files expect:
//
//	 1– 4  created, started, dispatch queued and acked
//	 5     resource.registered workspace (every step, on completion)
//	 6     resource.bound
//	 7     resource.checkpointed B0 (the published baseline, gen 0)
//	 8–11  llm_call gpt (its start raises gen 1: coverage ends)
//	12–15  tool_call write_file [workspace] (gen 2, due)
//	16     resource.checkpointed C1, sent with the complete: covers from 15
//	17–20  tool_call write_file [workspace] (gen 3, due)
//	21     resource.checkpoint_failed: the client's capture failed
//	22     resource.checkpoint_failed stale_generation (a late gen-2 capture)
//	23–26  tool_call read_file (no resources; gen 4)
//	27     resource.checkpointed C2 (the completion capture, gen 4)
//	28     execution.completed
//
// Covered: 1–4 (nothing registered), 7–9, 15–18, 27–28.
const (
	sourceTypes = "execution.created,execution.started,dispatch.queued,dispatch.acked," +
		"resource.registered,resource.bound,resource.checkpointed," +
		"step.proposed,step.allowed,step.executing,step.succeeded," +
		"step.proposed,step.allowed,step.executing,step.succeeded,resource.checkpointed," +
		"step.proposed,step.allowed,step.executing,step.succeeded,resource.checkpoint_failed," +
		"resource.checkpoint_failed," +
		"step.proposed,step.allowed,step.executing,step.succeeded," +
		"resource.checkpointed,execution.completed"
	registerWS = `{"key":"workspace","driver_id":"local.v1","configuration":{"root":"ws"},"every_steps":1,"on_completion":true}`
	llmStep    = `{"kind":"llm_call","target":"gpt","args":{"turn":1},"resources":[]}`
	write1     = `{"kind":"tool_call","target":"write_file","args":{"path":"a.txt"},"resources":["workspace"]}`
	write2     = `{"kind":"tool_call","target":"write_file","args":{"path":"b.txt"},"resources":["workspace"]}`
	readStep   = `{"kind":"tool_call","target":"read_file","args":{"path":"a.txt"},"resources":[]}`
)

func resourceFlow(t *testing.T, k *kt.Kernel, a *kt.Agent) string {
	t.Helper()
	id := k.CreateExecution(a.ID, `{"task":"fix the bug"}`)
	l := kt.LeaseOf(a.NextWebhook())
	waitEvent(t, k, id, "dispatch.acked", 1)
	ex := "/v0/executions/" + id
	k.Must(200, a.Request("POST", ex+"/resources", []byte(registerWS), l))
	k.Must(204, a.Request("POST", ex+"/resources/workspace/binding", []byte(`{"binding":{"dir":"/tmp/ws-1"}}`), l))
	k.Must(204, a.Request("POST", ex+"/resources/checkpoints", []byte(`{"captures":[{"key":"workspace","generation":0,"checkpoint_ref":"B0"}]}`), l))
	llm := a.Submit(id, l, llmStep)
	a.Complete(id, llm.StepID, l, `"edit a.txt"`)
	w1 := a.Submit(id, l, write1)
	if b, _ := json.Marshal(w1.Resources); string(b) != `[{"due":true,"generation":2,"key":"workspace"}]` {
		t.Fatalf("write 1 proceed resources %s", b)
	}
	k.Must(200, a.Request("POST", ex+"/steps/"+w1.StepID+"/complete",
		[]byte(`{"result":"wrote a.txt","captures":[{"key":"workspace","generation":2,"checkpoint_ref":"C1"}]}`), l))
	w2 := a.Submit(id, l, write2)
	k.Must(200, a.Request("POST", ex+"/steps/"+w2.StepID+"/complete",
		[]byte(`{"result":"wrote b.txt","capture_failures":[{"key":"workspace","generation":3,"error":"snapshot quota exceeded"}]}`), l))
	// A capture taken before write 2 started, reported late: refused.
	k.Must(204, a.Request("POST", ex+"/resources/checkpoints", []byte(`{"captures":[{"key":"workspace","generation":2,"checkpoint_ref":"C-late"}]}`), l))
	rd := a.Submit(id, l, readStep)
	a.Complete(id, rd.StepID, l, `"a"`)
	k.Must(204, a.Request("POST", ex+"/resources/checkpoints", []byte(`{"captures":[{"key":"workspace","generation":4,"checkpoint_ref":"C2"}]}`), l))
	a.Finish(id, l, `{"fixed":true}`)
	if got := kt.Join(k.EventTypes(id)); got != sourceTypes {
		t.Fatalf("source log:\n got %s\nwant %s", got, sourceTypes)
	}
	return id
}

// coverageRow is one event line of `exec coverage`.
type coverageRow struct {
	seq            int64
	fork, restores string
	event          string
}

// parseCoverage reads the event table of `exec coverage` plain output by the
// columns of its header line.
func parseCoverage(t *testing.T, out string) []coverageRow {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var rows []coverageRow
	var cols [3]int
	inTable := false
	for _, l := range lines {
		r := []rune(l)
		if !inTable {
			if strings.HasPrefix(strings.TrimSpace(l), "SEQ  FORK THERE") {
				inTable = true
				for i, name := range []string{"FORK THERE", "RESTORES", "EVENT"} {
					cols[i] = len([]rune(l[:strings.Index(l, name)]))
				}
			}
			continue
		}
		cell := func(from, to int) string {
			if from > len(r) {
				return ""
			}
			if to > len(r) || to < 0 {
				to = len(r)
			}
			return strings.TrimSpace(string(r[from:to]))
		}
		seq, err := strconv.ParseInt(cell(0, cols[0]), 10, 64)
		if err != nil {
			t.Fatalf("coverage line %q: %v", l, err)
		}
		rows = append(rows, coverageRow{seq: seq, fork: cell(cols[0], cols[1]), restores: cell(cols[1], cols[2]), event: cell(cols[2], -1)})
	}
	if !inTable {
		t.Fatalf("no event table in:\n%s", out)
	}
	return rows
}

type pointAnswer struct {
	AtSeq     int64 `json:"at_seq"`
	Covered   bool  `json:"covered"`
	Resources []struct {
		Key           string `json:"key"`
		Covered       bool   `json:"covered"`
		Reason        string `json:"reason"`
		CheckpointRef string `json:"checkpoint_ref"`
		CheckpointSeq int64  `json:"checkpoint_seq"`
	} `json:"resources"`
}

// checkCoverageAgainstKernel compares every line of `exec coverage` with the
// kernel's own point answer for that event, and each event name with the
// log: the CLI computes the lines from the ranges and the log, so this
// checks that computation on every event.
func checkCoverageAgainstKernel(t *testing.T, k *kt.Kernel, id, out string) {
	t.Helper()
	rows := parseCoverage(t, out)
	log := k.Events(id)
	if len(rows) != len(log) {
		t.Fatalf("coverage of %s: %d lines for %d events:\n%s", id, len(rows), len(log), out)
	}
	words := map[string]string{"no_checkpoint": "no checkpoint", "step_started": "step started"}
	for i, row := range rows {
		if row.seq != int64(i+1) || !strings.HasPrefix(row.event, log[i].Type) {
			t.Fatalf("line %d is %+v, the log has %d %s", i+1, row, log[i].Seq, log[i].Type)
		}
		var p pointAnswer
		k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", id, row.seq), nil, nil)).JSON(t, &p)
		wantFork := "✔ covered"
		if !p.Covered {
			var why []string
			for _, r := range p.Resources {
				if !r.Covered {
					why = append(why, words[r.Reason])
				}
			}
			wantFork = "✘ " + strings.Join(why, "; ")
		}
		var restores []string
		for _, r := range p.Resources {
			if r.CheckpointSeq == 0 {
				restores = append(restores, r.Key+"=(initial)")
			} else {
				restores = append(restores, fmt.Sprintf("%s=%s@%d", r.Key, r.CheckpointRef, r.CheckpointSeq))
			}
		}
		wantRestores := strings.Join(restores, " ")
		if wantRestores == "" {
			wantRestores = "-"
		}
		if row.fork != wantFork || row.restores != wantRestores {
			t.Errorf("%s event %d: the CLI says %q / %q, the kernel %q / %q", id, row.seq, row.fork, row.restores, wantFork, wantRestores)
		}
	}
}

// TestForkAndCoverageOutput runs the resource flow, forks it at a covered
// point, inside a gap after a checkpoint, before any checkpoint and before
// any resource, and checks the plain output of `exec coverage` (with every
// line checked against the kernel's point answer), `exec coverage --at`,
// `exec fork`, `exec get` of a fork, `exec forks` and the timelines of the
// source and of a fork.
func TestForkAndCoverageOutput(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("coder", "")
	src := resourceFlow(t, k, a)
	names := []string{src, "<src>", src[28:], "<src8>"}

	cov := cli(t, k, 0, "exec", "coverage", src[28:])
	if cov.Stderr != "" {
		t.Fatalf("coverage wrote to stderr: %s", cov.Stderr)
	}
	if !strings.Contains(cov.Stdout, "  covered        1-4, 7-9, 15-18, 27-28\n") ||
		!strings.Contains(cov.Stdout, "  workspace      7-9, 15-18, 27-28  (registered at 5)\n") {
		t.Fatalf("coverage ranges:\n%s", cov.Stdout)
	}
	checkCoverageAgainstKernel(t, k, src, cov.Stdout)
	var points strings.Builder
	points.WriteString(cov.Stdout)
	for _, at := range []string{"3", "6", "16", "22"} {
		r := cli(t, k, 0, "exec", "coverage", src, "--at", at)
		points.WriteString("--- --at " + at + "\n" + r.Stdout)
	}
	golden(t, "fork-coverage", normalize(points.String(), names...))

	ev := cli(t, k, 0, "exec", "events", src)
	golden(t, "fork-source-events", normalize(ev.Stdout, names...))
	for _, want := range []string{
		`resource.registered     workspace  driver local.v1  checkpoint every step + on completion  config {"r`,
		`resource.bound          workspace  binding {"dir":"/tmp/ws-1"}`,
		`resource.checkpointed   workspace  checkpoint "C1"  gen 2  covers from 15`,
		`resource.checkpoint_failed workspace  gen 3  capture failed: "snapshot quota exceeded"`,
		`resource.checkpoint_failed workspace  gen 2  refused stale_generation: a step began after the capture`,
		`step.executing          tool_call write_file  changes workspace  gen workspace→2`,
		`step.executing          llm_call gpt  gen workspace→1`,
	} {
		if !strings.Contains(ev.Stdout, want) {
			t.Errorf("the timeline lacks %q:\n%s", want, ev.Stdout)
		}
	}

	// Forks: covered (16), a gap after C1 (22), before any checkpoint (6),
	// before the resource (3).
	fork := func(at string) (string, string) {
		r := cli(t, k, 0, "exec", "fork", src[28:], "--at", at)
		first, _, _ := strings.Cut(r.Stdout, "\n")
		id := strings.TrimPrefix(first, "execution ")
		if len(id) != 36 {
			t.Fatalf("fork --at %s printed:\n%s", at, r.Stdout)
		}
		waitEvent(t, k, id, "dispatch.acked", 1)
		return id, r.Stdout
	}
	f16, out16 := fork("16")
	f22, out22 := fork("22")
	f6, out6 := fork("6")
	f3, out3 := fork("3")
	for _, f := range []struct{ id, name string }{{f16, "f16"}, {f22, "f22"}, {f6, "f6"}, {f3, "f3"}} {
		names = append(names, f.id, "<"+f.name+">", f.id[28:], "<"+f.name+"-8>")
	}
	golden(t, "fork-create", normalize("--- --at 16\n"+out16+"--- --at 22\n"+out22+"--- --at 6\n"+out6+"--- --at 3\n"+out3, names...))
	for _, c := range []struct {
		out, want string
	}{
		{out16, `    workspace    from checkpoint "C1" (event 15): exactly the state at the fork point`},
		{out22, `    workspace    from checkpoint "C1" (event 15): older than the fork point; later steps replay without their changes`},
		{out6, `    workspace    from the initial environment (no checkpoint at or before the fork point)`},
		{out3, `  restoration    nothing to restore (no resources at the fork point)`},
	} {
		if !strings.Contains(c.out, c.want+"\n") || !strings.Contains(c.out, "  forked from    "+src+" at event ") {
			t.Errorf("fork output lacks %q:\n%s", c.want, c.out)
		}
	}
	// The CLI printed what the kernel holds.
	for id, at := range map[string]float64{f16: 16, f22: 22, f6: 6, f3: 3} {
		e := k.Execution(id)
		if e["forked_from"] != src || e["fork_seq"] != at {
			t.Fatalf("fork %s: %v", id, e)
		}
	}

	get := cli(t, k, 0, "exec", "get", f22)
	golden(t, "fork-get", normalize(get.Stdout, names...))
	if !strings.Contains(get.Stdout, "  restoration    not covered: a resource starts from an earlier state\n") {
		t.Fatalf("get of an uncovered fork:\n%s", get.Stdout)
	}
	if g := cli(t, k, 0, "exec", "get", src); strings.Contains(g.Stdout, "forked from") || strings.Contains(g.Stdout, "restoration") {
		t.Fatalf("a root shows lineage:\n%s", g.Stdout)
	}

	forks := cli(t, k, 0, "exec", "forks", src)
	golden(t, "fork-forks", normalize(forks.Stdout, names...))
	rows := strings.Split(strings.TrimSpace(forks.Stdout), "\n")
	wantOrder := []string{f3, f6, f22, f16}
	if len(rows) != len(wantOrder) {
		t.Fatalf("forks:\n%s", forks.Stdout)
	}
	for i, r := range rows {
		cells := strings.Split(r, "\t")
		if len(cells) != 6 || cells[0] != wantOrder[i][28:] {
			t.Fatalf("forks row %d %q, want fork %s first (newest first)", i, r, wantOrder[i])
		}
	}
	if !strings.Contains(forks.Stdout, "\t22\tuncovered\tworkspace=C1@15\t") || !strings.Contains(forks.Stdout, "\t16\tcovered\tworkspace=C1@15\t") ||
		!strings.Contains(forks.Stdout, "\t6\tuncovered\tworkspace=(initial)\t") || !strings.Contains(forks.Stdout, "\t3\tno resources\t-\t") {
		t.Fatalf("forks restoration columns:\n%s", forks.Stdout)
	}
	// Only direct forks: a fork of a fork is listed under its own source.
	f22f := strings.TrimPrefix(strings.SplitN(cli(t, k, 0, "exec", "fork", f22, "--at", "17").Stdout, "\n", 2)[0], "execution ")
	waitEvent(t, k, f22f, "dispatch.acked", 1)
	if again := cli(t, k, 0, "exec", "forks", src); len(strings.Split(strings.TrimSpace(again.Stdout), "\n")) != 4 {
		t.Fatalf("forks of the source after a fork of a fork:\n%s", again.Stdout)
	}
	if sub := cli(t, k, 0, "exec", "forks", f22); !strings.HasPrefix(sub.Stdout, f22f[28:]+"\t") || strings.Count(sub.Stdout, "\n") != 1 {
		t.Fatalf("forks of the fork:\n%s", sub.Stdout)
	}
	if none := cli(t, k, 0, "exec", "forks", f3); none.Stdout != "" || none.Stderr != "" {
		t.Fatalf("no forks: %s", none)
	}

	// The fork's own log, with its copied checkpoints, and its coverage,
	// whose copied positions take their answers from those copies.
	fev := cli(t, k, 0, "exec", "events", f22)
	golden(t, "fork-events", normalize(fev.Stdout, names...))
	for _, want := range []string{
		"execution.forked        from " + src[28:] + "  at seq 22  uncovered  restores workspace=C1@15",
		`resource.initialized    workspace  gen 4  restored from checkpoint "C1"`,
		`resource.checkpointed   workspace  checkpoint "B0"  gen 0  covered 3-5`,
		`resource.checkpointed   workspace  checkpoint "C1"  gen 2  covered 11-13`,
	} {
		if !strings.Contains(fev.Stdout, want) {
			t.Errorf("the fork's timeline lacks %q:\n%s", want, fev.Stdout)
		}
	}
	fcov := cli(t, k, 0, "exec", "coverage", f22)
	golden(t, "fork-fork-coverage", normalize(fcov.Stdout, names...))
	checkCoverageAgainstKernel(t, k, f22, fcov.Stdout)
	checkCoverageAgainstKernel(t, k, f16, cli(t, k, 0, "exec", "coverage", f16).Stdout)
	checkCoverageAgainstKernel(t, k, f22f, cli(t, k, 0, "exec", "coverage", f22f).Stdout)
	if f6cov := cli(t, k, 0, "exec", "events", f6); !strings.Contains(f6cov.Stdout, "resource.initialized    workspace  gen 1  starts from the initial environment") {
		t.Fatalf("initial-environment restore:\n%s", f6cov.Stdout)
	}

	// On a terminal: a headline, and how to follow the fork.
	tty := stripANSI(runPTY(t, []string{"REBUNO_URL=" + k.URL, "TERM=xterm-256color"}, "exec", "fork", src, "--at", "16"))
	if !regexp.MustCompile(`✔ Forked `+src[28:]+` at event 16 → new execution [0-9a-f-]{36} \(running\)`).MatchString(tty) ||
		!strings.Contains(tty, "follow it: rebuno exec watch ") || !strings.Contains(tty, "restoration    covered: every resource") {
		t.Fatalf("fork on a terminal:\n%s", tty)
	}
	ttyCov := stripANSI(runPTY(t, []string{"REBUNO_URL=" + k.URL, "TERM=xterm-256color"}, "exec", "coverage", src))
	if !strings.Contains(ttyCov, "fork at an event: rebuno exec fork "+src[28:]+" --at <seq>") {
		t.Fatalf("coverage on a terminal:\n%s", ttyCov)
	}
}

// TestForkAndCoverageJSON: --json prints the kernel's answers unchanged.
func TestForkAndCoverageJSON(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("coder", "")
	src := resourceFlow(t, k, a)
	ex := "/v0/executions/" + src

	ranges := cli(t, k, 0, "exec", "coverage", src, "--json")
	if want := k.Must(200, k.Do("GET", ex+"/coverage", nil, nil)).Body; ranges.Stdout != strings.TrimSpace(string(want))+"\n" {
		t.Fatalf("coverage --json:\n got %s\nwant %s", ranges.Stdout, want)
	}
	var rg struct {
		Last   int64      `json:"last_event_seq"`
		Ranges [][2]int64 `json:"covered_ranges"`
	}
	if err := json.Unmarshal([]byte(ranges.Stdout), &rg); err != nil || rg.Last != 28 || fmt.Sprint(rg.Ranges) != "[[1 4] [7 9] [15 18] [27 28]]" {
		t.Fatalf("ranges %v %+v", err, rg)
	}
	for _, at := range []int{3, 6, 9, 16, 22, 28} {
		r := cli(t, k, 0, "exec", "coverage", src, "--at", strconv.Itoa(at), "--json")
		want := k.Must(200, k.Do("GET", fmt.Sprintf("%s/coverage?at_seq=%d", ex, at), nil, nil)).Body
		if r.Stdout != strings.TrimSpace(string(want))+"\n" {
			t.Fatalf("coverage --at %d --json:\n got %s\nwant %s", at, r.Stdout, want)
		}
	}
	var p pointAnswer
	json.Unmarshal([]byte(cli(t, k, 0, "exec", "coverage", src, "--at", "22", "--json").Stdout), &p)
	if p.Covered || len(p.Resources) != 1 || p.Resources[0].Reason != "step_started" || p.Resources[0].CheckpointRef != "C1" || p.Resources[0].CheckpointSeq != 15 {
		t.Fatalf("point 22: %+v", p)
	}

	fr := cli(t, k, 0, "exec", "fork", src, "--at", "22", "--json")
	var f struct {
		ID           string                     `json:"id"`
		Status       string                     `json:"status"`
		ForkedFrom   string                     `json:"forked_from"`
		ForkSeq      int64                      `json:"fork_seq"`
		ResourceKeys []string                   `json:"resource_keys"`
		Restoration  map[string]json.RawMessage `json:"restoration"`
	}
	if err := json.Unmarshal([]byte(fr.Stdout), &f); err != nil || strings.Count(fr.Stdout, "\n") != 1 {
		t.Fatalf("fork --json: %v %q", err, fr.Stdout)
	}
	if f.Status != "running" || f.ForkedFrom != src || f.ForkSeq != 22 || kt.Join(f.ResourceKeys) != "workspace" ||
		string(f.Restoration["workspace"]) != `{"checkpoint_ref":"C1","checkpoint_seq":15,"covered":false}` {
		t.Fatalf("fork --json: %s", fr.Stdout)
	}
	// Byte for byte what the kernel serves for the fork.
	if want := k.Must(200, k.Do("GET", "/v0/executions/"+f.ID, nil, nil)).Body; cli(t, k, 0, "exec", "get", f.ID, "--json").Stdout != strings.TrimSpace(string(want))+"\n" {
		t.Fatalf("exec get --json of a fork differs from the kernel's")
	}
	f2 := cli(t, k, 0, "exec", "fork", src, "--at", "16", "--json")
	var second map[string]any
	json.Unmarshal([]byte(f2.Stdout), &second)

	page := cli(t, k, 0, "exec", "forks", src, "--json")
	if want := k.Must(200, k.Do("GET", ex+"/forks", nil, nil)).Body; page.Stdout != strings.TrimSpace(string(want))+"\n" {
		t.Fatalf("forks --json:\n got %s\nwant %s", page.Stdout, want)
	}
	// --all follows next_cursor and streams one fork per line, newest first.
	all := cli(t, k, 0, "exec", "forks", src, "--json", "--all", "--limit", "1")
	lines := strings.Split(strings.TrimSpace(all.Stdout), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"id":"`+second["id"].(string)+`"`) || !strings.Contains(lines[1], `"id":"`+f.ID+`"`) {
		t.Fatalf("forks --all --json:\n%s", all.Stdout)
	}
	// One page of one: the rest is offered on stderr.
	one := cli(t, k, 0, "exec", "forks", src, "--limit", "1")
	if strings.Count(one.Stdout, "\n") != 1 || !strings.Contains(one.Stderr, "more: rebuno exec forks "+src[28:]+" --cursor "+second["id"].(string)+" --limit 1") {
		t.Fatalf("forks --limit 1: %s", one)
	}
	// The fork's events stream as JSON too, from its own seq 1.
	evs := strings.Split(strings.TrimSpace(cli(t, k, 0, "exec", "events", f.ID, "--json").Stdout), "\n")
	var first, forked struct {
		Seq     int64          `json:"event_seq"`
		Type    string         `json:"type"`
		Payload map[string]any `json:"payload"`
	}
	json.Unmarshal([]byte(evs[0]), &first)
	json.Unmarshal([]byte(evs[1]), &forked)
	if first.Seq != 1 || first.Type != "execution.created" || forked.Type != "execution.forked" || forked.Payload["source_execution_id"] != src {
		t.Fatalf("fork events --json: %s / %s", evs[0], evs[1])
	}
}

// agentPost sends a v1-signed agent request and requires status want.
func agentPost(t *testing.T, k *kt.Kernel, a *kt.Agent, l kt.Lease, path, body string, want int) []byte {
	t.Helper()
	return k.Must(want, a.Request("POST", path, []byte(body), l)).Body
}

// TestForkWatch: `exec fork --watch` prints the fork, then follows its
// timeline (the restore, replays and new steps) until it ends; exit 0 when
// it completes, 4 when it fails.
func TestForkWatch(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("coder", "")
	src := resourceFlow(t, k, a)
	env := []string{"REBUNO_URL=" + k.URL}

	w := startWatch(t, env, "exec", "fork", src, "--at", "16", "--watch")
	wh := a.NextWebhook()
	fid := wh.ExecutionID
	watchFor(t, w, "the fork's block", func() bool { return w.has(regexp.MustCompile(`^execution ` + fid + `$`)) })
	l := kt.LeaseOf(wh)
	ex := "/v0/executions/" + fid
	// A fork at a covered point: its resource is restored from C1, covered,
	// so the agent takes no baseline.
	var view map[string]any
	json.Unmarshal(agentPost(t, k, a, l, ex+"/resources", registerWS, 200), &view)
	if view["covered"] != true || view["checkpoint_ref"] != "C1" || view["binding"] != nil {
		t.Fatalf("fork's view: %v", view)
	}
	agentPost(t, k, a, l, ex+"/resources/workspace/binding", `{"binding":{"dir":"/tmp/ws-2"}}`, 204)
	for _, s := range []string{llmStep, write1} {
		if d := a.Submit(fid, l, s); d.Decision != "replay" {
			t.Fatalf("copied step: %+v", d)
		}
	}
	w3 := a.Submit(fid, l, `{"kind":"tool_call","target":"write_file","args":{"path":"c.txt"},"resources":["workspace"]}`)
	// Covered at 16: the fork keeps the source's generation there (2), and
	// this first live start raises it to 3.
	if b, _ := json.Marshal(w3.Resources); string(b) != `[{"due":true,"generation":3,"key":"workspace"}]` {
		t.Fatalf("fork's first write: %s", b)
	}
	agentPost(t, k, a, l, ex+"/steps/"+w3.StepID+"/complete",
		`{"result":"wrote c.txt","captures":[{"key":"workspace","generation":3,"checkpoint_ref":"F1"}]}`, 200)
	a.Finish(fid, l, `{"fixed":true,"forked":true}`)
	if code := w.wait(t); code != 0 {
		t.Fatalf("fork --watch exit %d\n%s", code, w.errText())
	}
	for _, re := range []string{
		`^  restoration    covered: every resource starts exactly as it was at the fork point$`,
		`⑂ execution\.forked +from ` + src[28:] + `  at seq 16  covered  restores workspace=C1@15$`,
		`◆ resource\.bound +workspace  binding \{"dir":"/tmp/ws-2"\}$`,
		`▸ step\.executing +tool_call write_file  changes workspace  gen workspace→3$`,
		`◆ resource\.checkpointed +workspace  checkpoint "F1"  gen 3  covers from \d+$`,
		`^✔ execution ` + fid[28:] + ` completed after `,
	} {
		if !w.has(regexp.MustCompile(re)) {
			w.mu.Lock()
			t.Fatalf("fork --watch lacks %s:\n%s", re, strings.Join(w.lines, "\n"))
		}
	}
	// Every event of the fork exactly once.
	for seq, n := range w.seqCounts() {
		if n != 1 {
			t.Fatalf("event %d printed %d times", seq, n)
		}
	}
	if got, want := len(w.seqCounts()), len(k.Events(fid)); got != want {
		t.Fatalf("watch printed %d events, the fork has %d", got, want)
	}

	// A fork that fails: exit 4; --json streams the fork, then its events.
	w = startWatch(t, env, "exec", "fork", src, "--at", "6", "--watch", "--json")
	wh = a.NextWebhook()
	agentPost(t, k, a, kt.LeaseOf(wh), "/v0/executions/"+wh.ExecutionID+"/fail", `{"error":"checkpoint_unavailable: resource \"workspace\": gone"}`, 204)
	if code := w.wait(t); code != 4 {
		t.Fatalf("failed fork --watch: exit %d\n%s", code, w.errText())
	}
	w.mu.Lock()
	lines := append([]string(nil), w.lines...)
	w.mu.Unlock()
	var head map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &head); err != nil || head["id"] != wh.ExecutionID || head["fork_seq"] != float64(6) {
		t.Fatalf("first line: %v %s", err, lines[0])
	}
	var last struct{ Type string }
	json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if last.Type != "execution.failed" || len(lines) != 1+len(k.Events(wh.ExecutionID)) {
		t.Fatalf("fork --watch --json:\n%s", strings.Join(lines, "\n"))
	}
}

// TestForkErrors: usage errors exit 2; refusals exit 1 with the kernel's
// error and a hint; --idempotency-key returns the same fork.
func TestForkErrors(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("coder", "")
	src := resourceFlow(t, k, a)
	for _, c := range []struct {
		code int
		args []string
		want []string
	}{
		{2, []string{"exec", "fork", src}, []string{"error: --at is required", "Run 'rebuno exec fork --help' for usage."}},
		{2, []string{"exec", "fork", src, "--at", "0"}, []string{"error: invalid --at 0"}},
		{2, []string{"exec", "fork", src, "--at", "x"}, []string{`invalid argument "x" for "--at"`}},
		{2, []string{"exec", "fork", src, src, "--at", "3"}, []string{"takes 1 argument (id), got 2"}},
		{2, []string{"exec", "fork", "zz", "--at", "3"}, []string{`invalid execution id "zz"`}},
		{1, []string{"exec", "fork", src, "--at", "29"}, []string{"error: validation_error: ", "at_seq must be between 1 and 28",
			"hint: --at must name one of the execution's events; `rebuno exec coverage " + src[28:] + "` lists them"}},
		{1, []string{"exec", "fork", "01a237ae-7cb5-73f2-81a0-1bce14b3cad6", "--at", "1"}, []string{"error: not_found: ",
			"hint: no execution 01a237ae-7cb5-73f2-81a0-1bce14b3cad6 on this kernel"}},
		{2, []string{"exec", "coverage", src, "--at", "-1"}, []string{"error: invalid --at -1"}},
		{1, []string{"exec", "coverage", src, "--at", "99"}, []string{"at_seq must be between 1 and 28", "hint: --at must name one of the execution's events"}},
		{1, []string{"exec", "coverage", "01a237ae-7cb5-73f2-81a0-1bce14b3cad6"}, []string{"error: not_found: "}},
		{2, []string{"exec", "forks", src, "--limit", "500"}, []string{"error: invalid --limit 500: 1 to 200"}},
		{2, []string{"exec", "forks", src, "--cursor", "abc"}, []string{"error: invalid --cursor"}},
		{1, []string{"exec", "forks", "01a237ae-7cb5-73f2-81a0-1bce14b3cad6"}, []string{"error: not_found: ", "hint: no execution"}},
		{3, []string{"exec", "fork", src, "--at", "3", "--url", closedURL(t)}, []string{"error: cannot reach the kernel"}},
	} {
		r := cli(t, k, c.code, c.args...)
		for _, w := range c.want {
			if !strings.Contains(r.Stderr, w) {
				t.Errorf("rebuno %s: stderr lacks %q:\n%s", strings.Join(c.args, " "), w, r)
			}
		}
		if r.Stdout != "" {
			t.Errorf("rebuno %s printed on stdout: %s", strings.Join(c.args, " "), r.Stdout)
		}
	}
	if n := len(k.Must(200, k.Do("GET", "/v0/executions/"+src+"/forks", nil, nil)).Map(t)["executions"].([]any)); n != 0 {
		t.Fatalf("refused forks left %d forks", n)
	}

	// The same Idempotency-Key gives the same fork; another request under
	// it is a conflict.
	f1 := cli(t, k, 0, "exec", "fork", src, "--at", "16", "--idempotency-key", "fork-16", "--json")
	f2 := cli(t, k, 0, "exec", "fork", src, "--at", "16", "--idempotency-key", "fork-16", "--json")
	var e1, e2 map[string]any
	json.Unmarshal([]byte(f1.Stdout), &e1)
	json.Unmarshal([]byte(f2.Stdout), &e2)
	if e1["id"] == nil || e1["id"] != e2["id"] {
		t.Fatalf("idempotent fork: %s / %s", f1.Stdout, f2.Stdout)
	}
	r := cli(t, k, 1, "exec", "fork", src, "--at", "22", "--idempotency-key", "fork-16")
	if !strings.Contains(r.Stderr, "error: conflict: ") || !strings.Contains(r.Stderr, "hint: this --idempotency-key was used for another fork request") {
		t.Fatalf("reused key: %s", r)
	}

	// A fork runs on its source's agent: once it is removed, forking is
	// refused with what to do.
	cli(t, k, 0, "exec", "cancel", e1["id"].(string))
	cli(t, k, 0, "agent", "rm", "coder")
	r = cli(t, k, 1, "exec", "fork", src, "--at", "16")
	if !strings.Contains(r.Stderr, `error: conflict: `) || !strings.Contains(r.Stderr, `agent "coder" is not registered`) ||
		!strings.Contains(r.Stderr, "hint: a fork runs on its source's agent: register it again") {
		t.Fatalf("fork without its agent: %s", r)
	}
	// Reads still work without the agent.
	cli(t, k, 0, "exec", "coverage", src)
	cli(t, k, 0, "exec", "forks", src)
}

// TestForkREPL: the REPL has the same verbs, with tab completion of
// execution ids.
func TestForkREPL(t *testing.T) {
	home := t.TempDir()
	tm, base := startREPL(t, home)
	ra := newREPLAgent(t, "coder")
	ra.base = base
	tm.send("agent add --id coder --webhook-url " + ra.srv.URL + "/webhook --secret " + ra.secret + "\r")
	tm.expect("Registered agent coder")
	tm.send("exec create coder\r")
	tm.expect("Created execution")
	tm.expect("rebuno> ")
	wh := ra.next(t)
	id := wh.ExecutionID
	ra.submit(t, wh, `{"kind":"tool_call","target":"lint","args":{}}`)
	replComplete(t, ra, wh)
	waitFor(t, "completion", func() bool {
		var e map[string]any
		getJSON(t, base+"/v0/executions/"+id, &e)
		return e["status"] == "completed"
	})

	tm.send("exec coverage \t")
	tm.expect("exec coverage " + id[28:])
	tm.send("\r")
	tm.expect("coverage of " + id)
	tm.expect("covered        1-")
	tm.expect("FORK THERE")
	tm.expect("rebuno> ")
	tm.send("exec fork " + id[28:] + " --at 4\r")
	tm.expect("Forked " + id[28:] + " at event 4 → new execution ")
	tm.expect("nothing to restore (no resources at the fork point)")
	tm.expect("follow it: exec watch ")
	tm.expect("rebuno> ")
	fwh := ra.next(t)
	tm.send("exec fo\t")
	tm.expect("exec fork")
	tm.send("s " + id[28:] + "\r")
	tm.expect("FORK AT")
	tm.expect(fwh.ExecutionID[28:])
	tm.expect("rebuno> ")
	tm.send("exec get " + fwh.ExecutionID[28:] + "\r")
	tm.expect("forked from    " + id + " at event 4")
	tm.send("quit\r")
	if code := tm.wait(); code != 0 {
		t.Fatalf("quit: exit %d\n%s", code, tm.output())
	}
}

// replComplete completes the execution of a REPL agent's webhook.
func replComplete(t *testing.T, ra *replAgent, wh kt.Webhook) {
	t.Helper()
	path := "/v0/executions/" + wh.ExecutionID + "/complete"
	body := []byte(`{"output":{"ok":true}}`)
	req, _ := http.NewRequest("POST", ra.base+path, bytes.NewReader(body))
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	attempt := strconv.FormatInt(wh.DispatchAttempt, 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Rebuno-Agent-Id", ra.id)
	req.Header.Set("Rebuno-Timestamp", ts)
	req.Header.Set("Rebuno-Dispatch-Id", wh.DispatchID)
	req.Header.Set("Rebuno-Dispatch-Attempt", attempt)
	req.Header.Set("Rebuno-Signature", auth.SignV1([]byte(ra.secret), "POST", path, ts, wh.DispatchID, attempt, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 204 {
		t.Fatalf("complete: %d %s", resp.StatusCode, b)
	}
}
