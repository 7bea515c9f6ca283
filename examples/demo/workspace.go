package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/cli"
)

// The story of `make demo`, with the Python agent of examples/python/demo
// (`make demo-ts`: the TypeScript agent of examples/typescript/demo):
//
//  1. The agent "coder" writes app.py, reads it, writes VERSION and improves
//     app.py, in a workspace resource (the SDK's LocalDirectory driver) that
//     is checkpointed after every write.
//  2. Its policy holds the write of VERSION for alice's approval: the
//     execution blocks, and the demo grants it with `rebuno approvals grant`.
//  3. In the middle of the second write of app.py the demo kills the agent
//     with SIGKILL and starts it again: the kernel redelivers, the agent
//     reopens the same workspace, the earlier steps replay and the
//     interrupted write runs again.
//  4. `rebuno exec coverage` shows at which events a fork restores the
//     workspace exactly; the demo forks at the first write's checkpoint with
//     `rebuno exec fork`.
//  5. The fork replays the first write, reads app.py live — and finds the
//     earlier content —, then reaches the same approval (approvals are never
//     copied). While it waits the demo prints the fork's workspace beside the
//     source's, then denies the release; the fork completes without it.
//
// Every part is checked at the end; a missing part fails the demo.

const (
	hello      = "print(\"hello\")\n"
	helloWorld = "print(\"hello, world\")\n"
	approver   = "alice"
)

// sdkAgent is the demo agent of one SDK: its language, the program that runs
// its script (with arguments before the script, and the directory to run
// in), and the name of the SDK's tool primitive for the narration.
type sdkAgent struct {
	language string
	runner   []string
	dir      string
	script   string
	toolName string
}

// typescriptAgent runs a TypeScript script with node and tsx's loader, in one
// process (so that a SIGKILL ends it whole), from the script's package: the
// nearest directory above it with a node_modules.
func typescriptAgent(node, script string) (sdkAgent, error) {
	abs, err := filepath.Abs(script)
	if err != nil {
		return sdkAgent{}, err
	}
	dir := filepath.Dir(abs)
	for {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "tsx")); err == nil {
			break
		}
		if parent := filepath.Dir(dir); parent != dir {
			dir = parent
			continue
		}
		return sdkAgent{}, fmt.Errorf("no node_modules/tsx above %s: run npm ci in its package", script)
	}
	return sdkAgent{language: "TypeScript", runner: []string{node, "--import", "tsx"}, dir: dir, script: abs, toolName: "defineTool"}, nil
}

func (a sdkAgent) cmd(kernelURL, listen, id, secret, resources string) *exec.Cmd {
	args := append(append([]string{}, a.runner[1:]...), a.script, "--kernel", kernelURL, "--listen", listen, "--id", id, "--secret", secret)
	cmd := exec.Command(a.runner[0], args...)
	cmd.Dir = a.dir
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1", "REBUNO_LOCAL_RESOURCES="+resources)
	return cmd
}

// checkpoint is what a resource.checkpointed event says.
type checkpoint struct {
	seq        int64
	ref        string
	generation int64
	coveredSeq int64
}

// sourceRun is what the demo saw while the source execution ran.
type sourceRun struct {
	workspace   string // the directory of its resource.bound
	bound       int
	approvalID  string
	granted     bool
	killed      bool
	reran       bool
	checkpoints []checkpoint
	failures    int
	readSeen    bool
}

// forkRun is what the demo saw while the fork ran.
type forkRun struct {
	workspace  string
	approvalID string
	atBlock    map[string]string // the fork's files while it waited for approval
	denied     bool
}

func runWorkspace(kernelBin string, sdk sdkAgent) error {
	start := time.Now()
	dir, err := os.MkdirTemp("", "rebuno-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	resources := filepath.Join(dir, "resources")
	policyFile := filepath.Join(filepath.Dir(sdk.script), "policy.yaml")

	say("The story: an agent edits files in a workspace resource; a write waits for approval; the agent is killed mid-write")
	say("and recovers; checkpoints are taken all along; then the execution is forked at an earlier event.")
	say("Starting the kernel on a fresh SQLite file in %s", dir)
	k, err := startKernel(kernelBin, dir)
	if err != nil {
		return err
	}
	defer stop(k.cmd)

	addr, secret, err := k.registerAgent("coder")
	if err != nil {
		return err
	}
	say("Registered the agent \"coder\"; its policy lets every step run but holds a write of VERSION for %s:", approver)
	if _, err := k.cli(0, "policy", "set", "coder", policyFile); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	agent := &agentProcess{addr: addr, ready: 30 * time.Second, log: logFile,
		start: func() *exec.Cmd { return sdk.cmd(k.url, addr, "coder", secret, resources) }}
	say("Starting the %s example agent (%s: a workspace resource, LocalDirectory, %s)", sdk.language, sdk.script, sdk.toolName)
	if err := agent.run(); err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	defer func() { agent.stop() }()

	body, err := k.post("/v0/executions", `{"agent_id":"coder","input":{"release":"1.0.0"}}`, 201)
	if err != nil {
		return fmt.Errorf("create execution: %w", err)
	}
	var created cli.Execution
	json.Unmarshal(body, &created)
	src := created.ID
	say("Created execution %s; following its event log:\n", src)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	run, final, err := watchSource(ctx, k, agent, src)
	if err != nil {
		return err
	}
	if err := checkSource(run, final); err != nil {
		return err
	}
	fmt.Println()
	say("What the agent processes did (their log):")
	replays := printAgentLog(agent, src)
	if replays == 0 {
		return errors.New("no step replayed after the approval or the crash")
	}
	say("Each dispatch reopened the same workspace; the steps recorded before replayed, and only the interrupted write ran twice.")
	srcFiles, err := readWorkspace(run.workspace)
	if err != nil {
		return fmt.Errorf("read the source's workspace: %w", err)
	}
	if want := map[string]string{"app.py": helloWorld, "VERSION": "1.0.0\n"}; !sameFiles(srcFiles, want) {
		return fmt.Errorf("the source's workspace holds %v, want %v", srcFiles, want)
	}

	// Coverage, then the fork point: the event the first write's checkpoint
	// covers from (its step.succeeded), where app.py still says "hello".
	first := run.checkpoints[1] // [0] is the baseline
	fmt.Println()
	say("Coverage: a fork at a covered event restores the workspace exactly as it was there.")
	if _, err := k.cli(3, "exec", "coverage", cli.ShortID(src)); err != nil {
		return err
	}
	if err := coveragePicture(k, src, first.coveredSeq); err != nil {
		return err
	}
	fmt.Println("      A checkpoint (◆) covers from the step outcome it travels with (or from its own event) until the next")
	fmt.Println("      step starts (▸): any running step may change the directory, so coverage ends there. The full table,")
	fmt.Println("      one row per event with what a fork there restores, is `rebuno exec coverage " + cli.ShortID(src) + "`.")
	fmt.Println()
	if _, err := k.cli(0, "exec", "coverage", cli.ShortID(src), "--at", strconv.FormatInt(first.coveredSeq, 10)); err != nil {
		return err
	}
	var point cli.CoveragePoint
	if err := k.get(fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", src, first.coveredSeq), &point); err != nil {
		return err
	}
	if !point.Covered {
		return fmt.Errorf("event %d, the first write's outcome, is not covered: %+v", first.coveredSeq, point)
	}
	var before cli.Execution
	if err := k.get("/v0/executions/"+src, &before); err != nil {
		return err
	}
	lastBefore, err := lastSeq(k, src)
	if err != nil {
		return err
	}

	fmt.Println()
	say("Forking at event %d, the first write's outcome: checkpoint %s holds app.py = %q there.", first.coveredSeq, shortRef(first.ref), hello)
	seqArg := strconv.FormatInt(first.coveredSeq, 10)
	if _, err := k.cli(0, "exec", "fork", cli.ShortID(src), "--at", seqArg); err != nil {
		return err
	}
	var forks cli.Page
	if err := k.get("/v0/executions/"+src+"/forks", &forks); err != nil {
		return err
	}
	if len(forks.Executions) != 1 {
		return fmt.Errorf("the source has %d forks, want 1", len(forks.Executions))
	}
	var fork cli.Execution
	json.Unmarshal(forks.Executions[0], &fork)
	say("Following the fork %s: its history up to event %d is copied (and replays), then it runs live:\n", fork.ID, first.coveredSeq)
	frun, forkFinal, err := watchFork(ctx, k, fork.ID, run.workspace, srcFiles)
	if err != nil {
		return err
	}
	fmt.Println()
	say("What the agent did for the fork (its log):")
	printAgentLog(agent, fork.ID)
	fmt.Println()
	say("The source has one fork; forks can be forked again at any of their own events:")
	if _, err := k.cli(0, "exec", "forks", cli.ShortID(src)); err != nil {
		return err
	}

	// What forks cost: every fork made a workspace of its own.
	dirs, _ := os.ReadDir(filepath.Join(resources, "workspaces"))
	objects := countFiles(filepath.Join(resources, "store", "objects"))
	snapshots := countFiles(filepath.Join(resources, "store", "snapshots"))
	fmt.Println()
	say("What it cost: %d workspace directories (the source's and the fork's), %d checkpoint manifests and %d stored file contents under %s.",
		len(dirs), snapshots, objects, resources)
	say("Every fork creates a resource and no driver deletes one: a provider reclaims them by expiry (LocalDirectory: delete its root).")

	if err := checkFork(k, src, fork.ID, first, lastBefore, before, frun, forkFinal, len(dirs)); err != nil {
		return err
	}
	say("The whole story checked out in %s. Read docs/resources-and-forks.md for the model behind it.", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// watchSource follows the source execution, granting its approval and
// killing the agent in the middle of the second write of app.py.
func watchSource(ctx context.Context, k *kernel, agent *agentProcess, id string) (*sourceRun, *cli.Execution, error) {
	run := &sourceRun{}
	var failure error
	fail := func(err error) {
		if failure == nil {
			failure = err
		}
	}
	final, err := cli.Watch(ctx, id, cli.WatchOptions{URL: k.url, Out: os.Stdout, Err: os.Stderr,
		OnEvent: func(ev cli.Event) {
			p := decode(ev.Payload)
			switch ev.Type {
			case "resource.bound":
				run.bound++
				run.workspace = bindingPath(p)
				if run.bound == 1 {
					aside("📁 the workspace is a new directory, %s; the SDK checkpoints it at once (a baseline)", run.workspace)
				}
			case "resource.checkpointed":
				c := checkpoint{seq: ev.Seq, ref: as[string](p["checkpoint_ref"]), generation: as[int64](p["generation"]), coveredSeq: as[int64](p["covered_seq"])}
				run.checkpoints = append(run.checkpoints, c)
				switch {
				case len(run.checkpoints) == 2:
					aside("◆ write_file declares the workspace; with every_steps=1 each write's outcome carries a checkpoint, recorded with it")
				case len(run.checkpoints) > 2 && c.coveredSeq == c.seq:
					aside("◆ a step started after the last checkpoint, so the handler's return brings one more (on_completion)")
				}
			case "resource.checkpoint_failed":
				run.failures++
			case "approval.requested":
				run.approvalID = as[string](p["approval_id"])
			case "execution.blocked":
				if run.granted || run.approvalID == "" {
					return
				}
				run.granted = true
				aside("⏸  the policy holds the write of VERSION; the agent's handler has unwound and nothing runs until %s decides:", approver)
				if _, err := k.cli(0, "approvals", "grant", cli.ShortID(run.approvalID), "--by", approver, "--rationale", "release looks good"); err != nil {
					fail(err)
				}
				fmt.Println()
			case "step.executing":
				if as[bool](p["retry"]) {
					run.reran = true
					aside("↻ the new attempt reopened the same directory (no second resource.bound), replayed the steps before, and runs\n" +
						"      the interrupted write again, in a new generation: a late checkpoint from the killed run would be refused")
					return
				}
				if as[string](p["target"]) == "read_file" && !run.readSeen {
					run.readSeen = true
					aside("▸ read_file declares nothing, yet any running step could change a directory: coverage ends at every step start")
				}
				if run.killed || as[string](p["target"]) != "write_file" {
					return
				}
				var st cli.Step
				if err := k.get("/v0/executions/"+id+"/steps/"+as[string](p["step_id"]), &st); err != nil {
					fail(err)
					return
				}
				args := decode(st.Args)
				if as[string](args["path"]) != "app.py" || as[string](args["content"]) != helloWorld {
					return
				}
				run.killed = true
				agent.kill()
				aside("💥 kill -9 the agent in the middle of this write, and start it again. The kernel redelivers when the lease lapses.")
				if err := agent.run(); err != nil {
					fail(fmt.Errorf("restart agent: %w", err))
				}
			}
		}})
	if err != nil {
		return nil, nil, fmt.Errorf("watch: %w", err)
	}
	return run, final, failure
}

func checkSource(run *sourceRun, final *cli.Execution) error {
	var out struct {
		Released bool              `json:"released"`
		Files    map[string]string `json:"files"`
	}
	json.Unmarshal(final.Output, &out)
	switch {
	case final.Status != "completed":
		return fmt.Errorf("the execution ended %s: %s", final.Status, final.FailureReason)
	case !run.granted:
		return errors.New("no approval was requested")
	case !run.killed:
		return errors.New("the agent was never killed")
	case !run.reran:
		return errors.New("no step was re-run after the crash")
	case run.bound != 1:
		return fmt.Errorf("the workspace was bound %d times, want once: later dispatches must reopen it", run.bound)
	case run.failures != 0:
		return fmt.Errorf("%d captures failed", run.failures)
	case len(run.checkpoints) < 3:
		return fmt.Errorf("%d checkpoints, want a baseline, the writes' and a completion checkpoint", len(run.checkpoints))
	case !out.Released || !sameFiles(out.Files, map[string]string{"app.py": helloWorld, "VERSION": "1.0.0\n"}):
		return fmt.Errorf("unexpected output %s", final.Output)
	}
	// The baseline covers from its own event; the next one travels with the
	// first write's outcome, the event just before it.
	if b := run.checkpoints[0]; b.coveredSeq != b.seq {
		return fmt.Errorf("the first checkpoint covers from %d, not its own event %d: not a baseline", b.coveredSeq, b.seq)
	}
	if c := run.checkpoints[1]; c.coveredSeq != c.seq-1 {
		return fmt.Errorf("the second checkpoint covers from %d, want the step outcome just before it (%d)", c.coveredSeq, c.seq-1)
	}
	return nil
}

// watchFork follows the fork; when it blocks on the release's approval it
// prints the fork's workspace beside the source's and denies the release.
func watchFork(ctx context.Context, k *kernel, id, srcWorkspace string, srcFiles map[string]string) (*forkRun, *cli.Execution, error) {
	run := &forkRun{}
	var failure error
	final, err := cli.Watch(ctx, id, cli.WatchOptions{URL: k.url, Out: os.Stdout, Err: os.Stderr,
		OnEvent: func(ev cli.Event) {
			p := decode(ev.Payload)
			switch ev.Type {
			case "execution.started":
				aside("⑂ events 3-%d came with the fork: the source's history up to the fork point, renumbered, keeping the source's\n"+
					"      times; the first write will replay. From here the fork runs on its own.", ev.Seq-1)
			case "resource.bound":
				run.workspace = bindingPath(p)
				aside("📁 the fork's workspace is a new directory, %s, restored from the checkpoint (no baseline needed: the point is covered)", run.workspace)
			case "approval.requested":
				run.approvalID = as[string](p["approval_id"])
			case "execution.blocked":
				if run.denied || run.approvalID == "" {
					return
				}
				run.denied = true
				files, err := readWorkspace(run.workspace)
				if err != nil {
					failure = fmt.Errorf("read the fork's workspace: %w", err)
					return
				}
				run.atBlock = files
				aside("⏸  the fork asks for the same approval again (approvals are never copied). Its workspace now, beside the source's:")
				printSideBySide(srcWorkspace, srcFiles, run.workspace, files)
				fmt.Printf("\n    This time %s keeps the release back:\n", approver)
				if _, err := k.cli(0, "approvals", "deny", cli.ShortID(run.approvalID), "--by", approver, "--rationale", "not this one"); err != nil {
					failure = err
				}
				fmt.Println()
			}
		}})
	if err != nil {
		return nil, nil, fmt.Errorf("watch the fork: %w", err)
	}
	return run, final, failure
}

func checkFork(k *kernel, src, forkID string, at checkpoint, lastBefore int64, before cli.Execution, run *forkRun, final *cli.Execution, dirs int) error {
	var fork cli.Execution
	if err := k.get("/v0/executions/"+forkID, &fork); err != nil {
		return err
	}
	var restoration map[string]struct {
		Ref     string `json:"checkpoint_ref"`
		Seq     int64  `json:"checkpoint_seq"`
		Covered bool   `json:"covered"`
	}
	json.Unmarshal(fork.Restoration, &restoration)
	ws, ok := restoration["workspace"]
	switch {
	case fork.ForkedFrom != src || fork.ForkSeq == nil || *fork.ForkSeq != at.coveredSeq:
		return fmt.Errorf("the fork's lineage is %s at %v, want %s at %d", fork.ForkedFrom, fork.ForkSeq, src, at.coveredSeq)
	case !ok || !ws.Covered || ws.Ref != at.ref || ws.Seq != at.coveredSeq:
		return fmt.Errorf("the fork's restoration is %s, want checkpoint %s of event %d, covered", fork.Restoration, at.ref, at.coveredSeq)
	case run.workspace == "" || run.atBlock == nil:
		return errors.New("the fork never bound a workspace or never waited for approval")
	case !sameFiles(run.atBlock, map[string]string{"app.py": hello}):
		return fmt.Errorf("the fork's workspace held %v while it waited, want only app.py = %q", run.atBlock, hello)
	case !run.denied:
		return errors.New("the fork's approval was never denied")
	case final.Status != "completed":
		return fmt.Errorf("the fork ended %s: %s", final.Status, final.FailureReason)
	case dirs != 2:
		return fmt.Errorf("%d workspace directories, want 2 (the source's and the fork's)", dirs)
	}
	var out struct {
		Released bool              `json:"released"`
		Files    map[string]string `json:"files"`
	}
	json.Unmarshal(final.Output, &out)
	if out.Released || !sameFiles(out.Files, map[string]string{"app.py": hello}) {
		return fmt.Errorf("the fork's output is %s, want no release and app.py = %q", final.Output, hello)
	}
	// The fork's read of app.py ran live and found the restored content.
	var steps []cli.Step
	if err := k.get("/v0/executions/"+forkID+"/steps", &steps); err != nil {
		return err
	}
	readLive := false
	for _, st := range steps {
		var result string
		if st.Target == "read_file" && st.Status == "succeeded" && json.Unmarshal(st.Result, &result) == nil && result == hello {
			readLive = true
		}
	}
	if !readLive {
		return fmt.Errorf("the fork's read_file did not return %q", hello)
	}
	// Forking appended nothing to the source.
	lastAfter, err := lastSeq(k, src)
	if err != nil {
		return err
	}
	var after cli.Execution
	if err := k.get("/v0/executions/"+src, &after); err != nil {
		return err
	}
	if lastAfter != lastBefore || after.Status != before.Status || string(after.Output) != string(before.Output) {
		return fmt.Errorf("forking changed the source: %d events before, %d after", lastBefore, lastAfter)
	}
	return nil
}

// coveragePicture draws an execution's coverage, one column per event: █
// where a fork is covered, · where it is not; ◆ where each checkpoint starts
// to cover, ▸ each step start, and ▲ the event the demo forks at.
func coveragePicture(k *kernel, id string, forkAt int64) error {
	var rg cli.CoverageRanges
	if err := k.get("/v0/executions/"+id+"/coverage", &rg); err != nil {
		return err
	}
	var events []cli.Event
	if err := k.get(fmt.Sprintf("/v0/executions/%s/events?after_seq=0&limit=1000", id), &events); err != nil {
		return err
	}
	n := int(rg.LastEventSeq)
	row := func() []rune { return []rune(strings.Repeat(" ", n)) }
	ruler, covered, checkpoints, starts, fork := row(), row(), row(), row(), row()
	for s := 1; s <= n; s++ {
		if s == 1 || s%5 == 0 {
			copy(ruler[s-1:], []rune(strconv.Itoa(s)))
		}
		covered[s-1] = '·'
		for _, r := range rg.Ranges {
			if int64(s) >= r[0] && int64(s) <= r[1] {
				covered[s-1] = '█'
			}
		}
	}
	for _, ev := range events {
		switch p := decode(ev.Payload); ev.Type {
		case "resource.checkpointed":
			if c := as[int64](p["covered_seq"]); c >= 1 && c <= int64(n) {
				checkpoints[c-1] = '◆'
			}
		case "step.executing":
			if ev.Seq <= int64(n) {
				starts[ev.Seq-1] = '▸'
			}
		}
	}
	fork[forkAt-1] = '▲'
	fmt.Println()
	for _, r := range []struct {
		label string
		cols  []rune
	}{{"event", ruler}, {"covered", covered}, {"checkpoint", checkpoints}, {"step start", starts}, {"fork here", fork}} {
		fmt.Println(strings.TrimRight(fmt.Sprintf("      %-11s %s", r.label, string(r.cols)), " "))
	}
	fmt.Println()
	return nil
}

// printAgentLog prints the agent's log lines about one execution and
// returns how many steps replayed.
func printAgentLog(agent *agentProcess, execID string) int {
	prefix := execID[len(execID)-8:] + " "
	replays := 0
	for _, line := range agent.lines() {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		text := strings.TrimPrefix(line, prefix)
		fmt.Println("      " + text)
		if strings.HasPrefix(strings.TrimSpace(text), "replay") {
			replays++
		}
	}
	return replays
}

// printSideBySide prints the files of two workspaces in two columns.
func printSideBySide(leftDir string, left map[string]string, rightDir string, right map[string]string) {
	names := map[string]bool{}
	for n := range left {
		names[n] = true
	}
	for n := range right {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	cell := func(files map[string]string, n string) string {
		c, ok := files[n]
		if !ok {
			return "(no such file)"
		}
		return strconv.Quote(c)
	}
	rows := [][3]string{{"file", "source …/" + lastTwo(leftDir), "fork …/" + lastTwo(rightDir)}}
	for _, n := range sorted {
		rows = append(rows, [3]string{n, cell(left, n), cell(right, n)})
	}
	w0, w1 := 0, 0
	for _, r := range rows {
		w0, w1 = max(w0, len([]rune(r[0]))), max(w1, len([]rune(r[1])))
	}
	for _, r := range rows {
		fmt.Printf("      %s   %s   %s\n", pad(r[0], w0), pad(r[1], w1), r[2])
	}
}

func pad(s string, w int) string { return s + strings.Repeat(" ", w-len([]rune(s))) }

func lastTwo(path string) string {
	base := filepath.Base(path)
	if len(base) > 8 {
		base = base[:8] + "…"
	}
	return filepath.Base(filepath.Dir(path)) + "/" + base
}

// readWorkspace reads every regular file at the top of a workspace.
func readWorkspace(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		files[e.Name()] = string(b)
	}
	return files, nil
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func countFiles(dir string) int {
	n := 0
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return nil
	})
	return n
}

func lastSeq(k *kernel, id string) (int64, error) {
	var rg cli.CoverageRanges
	if err := k.get("/v0/executions/"+id+"/coverage", &rg); err != nil {
		return 0, err
	}
	return rg.LastEventSeq, nil
}

func shortRef(ref string) string {
	if len(ref) > 19 {
		return ref[:19] + "…"
	}
	return ref
}

func decode(raw json.RawMessage) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	json.Unmarshal(raw, &m)
	return m
}

// as decodes raw into a T, the zero T when it does not fit: the demo checks
// what it finds instead.
func as[T any](raw json.RawMessage) T {
	var v T
	json.Unmarshal(raw, &v)
	return v
}

func bindingPath(p map[string]json.RawMessage) string {
	var b struct {
		Path string `json:"path"`
	}
	json.Unmarshal(p["binding"], &b)
	return b.Path
}
