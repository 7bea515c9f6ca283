package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestMain lets the test binary serve as the null kernel that CEIL starts
// (os.Executable is the test binary here).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == nullKernelArg {
		if err := runNullKernel(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// TestNullKernelSpeaksTheWire drives the null kernel as the step loop does,
// and checks that it refuses what the kernel refuses: it must pay for every
// check a kernel makes, or CEIL would flatter the machine.
func TestNullKernelSpeaksTheWire(t *testing.T) {
	pin := pinning{KernelCPU: -1, SelfCPU: -1, Impossible: "not pinned in tests"}
	k, err := startNullKernel("tok", pin, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	recv, err := newReceiver("agent-secret")
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()

	if err := newClient(k.URL, "wrong", "a1", "agent-secret").register(recv.URL, 60); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("register with a wrong token: %v, want 401", err)
	}
	c := newClient(k.URL, "tok", "a1", "agent-secret")
	if err := c.register(recv.URL, 60); err != nil {
		t.Fatal(err)
	}
	id, wh, _, err := start(context.Background(), c, recv, `{"x":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if wh.Attempt != 1 || wh.LeaseSeconds != 60 || wh.DispatchID == "" {
		t.Fatalf("webhook %+v", wh)
	}
	if recv.BadSig.Load() != 0 {
		t.Fatal("the webhook's signature did not verify")
	}

	args := `{"b":[1,2],"a":"x"}`
	d, err := c.submit(id, wh.lease(), []byte(`{"kind":"tool_call","target":"t.echo","args":`+args+`}`), 3)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonx.Parse([]byte(args), 64)
	if err != nil {
		t.Fatal(err)
	}
	if want := identity.StepID(id, "tool_call", "t.echo", identity.ArgsHash(v), 3); d.Decision != "proceed" || d.StepID != want {
		t.Fatalf("submit: %+v, want proceed with step %s", d, want)
	}
	if d, err := c.complete(id, d.StepID, wh.lease(), `{"ok":true}`); err != nil || d.Decision != "recorded" {
		t.Fatalf("complete: %+v, %v", d, err)
	}

	forger := newClient(k.URL, "tok", "a1", "another-secret")
	if _, err := forger.submit(id, wh.lease(), []byte(`{"kind":"tool_call","target":"t"}`), 0); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("submit signed with another secret: %v, want 401", err)
	}
	if _, err := c.submit(id, wh.lease(), []byte(`{"kind":"tool_call","target":"t",}`), 0); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("submit with invalid JSON: %v, want 400", err)
	}
	if err := c.finish(id, wh.lease(), `{"done":true}`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.submit(id, wh.lease(), []byte(`{"kind":"tool_call","target":"t"}`), 0); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("submit after the execution completed: %v, want 404", err)
	}
}

func isStatus(err error, status int) bool {
	var e *apiError
	return errors.As(err, &e) && e.Status == status
}

// TestCEILSmoke runs CEIL for half a second: steps flow without errors, and
// the summary lists it as a calibration, never as a target met or missed.
func TestCEILSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kernel for the header")
	}
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	cfg := &config{
		Kernel: kt.Binary(t), Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond,
		Only: map[string]bool{"CEIL": true}, Concurrency: 8, StepsPerExec: 40, JSON: jsonPath,
		TmpDir: t.TempDir(), GOMAXPROCS: 1,
	}
	r, out := runHarness(t, cfg)
	if len(r.Metrics) != 1 || r.Metrics[0].ID != "CEIL" {
		t.Fatalf("metrics %+v\n%s", r.Metrics, out.String())
	}
	m := r.Metrics[0]
	if m.Failed != "" || m.Errors != 0 || len(m.Values) == 0 || m.Values[0].Value <= 0 {
		t.Fatalf("CEIL: failed %q, errors %v, values %+v\n%s", m.Failed, m.ErrorList, m.Values, out.String())
	}
	if len(m.Targets) != 1 || !m.Targets[0].Calibration || !bytes.Contains(out.Bytes(), []byte("calibration")) {
		t.Fatalf("CEIL summary row %+v\n%s", m.Targets, out.String())
	}
}
