// Package cli_test drives the real `rebuno` binary as an operator would: the
// client commands against a running kernel (golden plain output, --json,
// every error and exit code), `exec watch` across a kernel restart, and the
// dev REPL through a pseudo-terminal.
package cli_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// result is one finished CLI invocation.
type result struct {
	Stdout, Stderr string
	Code           int
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.Code) + "\n--- stdout\n" + r.Stdout + "--- stderr\n" + r.Stderr
}

// cleanEnv is the environment without any REBUNO_ variable or colour
// override, so that only what a test sets applies.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "REBUNO_") || name == "NO_COLOR" || name == "CLICOLOR_FORCE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// run runs the binary with env (NAME=value) and args; stdin is empty.
func run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return runIn(t, "", env, args...)
}

func runIn(t *testing.T, stdin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kt.Binary(t), args...)
	cmd.Env = cleanEnv(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	r := result{Stdout: out.String(), Stderr: errb.String(), Code: code}
	if strings.Contains(r.Stderr, "goroutine ") || strings.Contains(r.Stderr, "panic:") {
		t.Fatalf("stack trace from %v:\n%s", args, r)
	}
	return r
}

// cli runs a client command against k and requires exit code want.
func cli(t *testing.T, k *kt.Kernel, want int, args ...string) result {
	t.Helper()
	r := run(t, []string{"REBUNO_URL=" + k.URL}, args...)
	if r.Code != want {
		t.Fatalf("rebuno %s: want exit %d, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

var (
	uuidRe  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRe  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	portRe  = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	shortRe = regexp.MustCompile(`\b(dispatch|approval) [0-9a-f]{8}\b`)
)

// normalize replaces what differs between runs: ids, times, ports.
func normalize(s string, names ...string) string {
	for i := 0; i+1 < len(names); i += 2 {
		s = strings.ReplaceAll(s, names[i], names[i+1])
	}
	s = uuidRe.ReplaceAllString(s, "<uuid>")
	s = timeRe.ReplaceAllString(s, "<time>")
	s = portRe.ReplaceAllString(s, "127.0.0.1:<port>")
	s = shortRe.ReplaceAllString(s, "$1 <short>")
	return s
}

// golden compares got with testdata/<name>.golden (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Fatalf("%s differs from %s:\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitEvent waits until the execution's log holds an event of type typ
// (count occurrences at least).
func waitEvent(t *testing.T, k *kt.Kernel, id, typ string, count int) {
	t.Helper()
	waitFor(t, typ, func() bool {
		n := 0
		for _, ty := range k.EventTypes(id) {
			if ty == typ {
				n++
			}
		}
		return n >= count
	})
}
