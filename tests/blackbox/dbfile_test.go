package blackbox

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestOneKernelPerDatabase starts four `rebuno dev` at once on a fresh
// database file: exactly one serves it (its migrations ran alone), the others
// exit at once naming the file and the holder's pid. kill -9 of the holder
// frees the file for the next kernel, which finds the first one's data.
func TestOneKernelPerDatabase(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "shared.db")
	type outcome struct {
		cmd     *exec.Cmd
		serving bool
		code    int
		stderr  string
	}
	outcomes := make([]*outcome, 4)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range outcomes {
		o := &outcome{cmd: exec.Command(kt.Binary(t), "dev", "--db", db, "--listen-addr", "127.0.0.1:0", "--no-repl")}
		outcomes[i] = o
		stderr, err := o.cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := o.cmd.Start(); err != nil {
				o.stderr = err.Error()
				return
			}
			var buf bytes.Buffer
			sc := bufio.NewScanner(io.TeeReader(stderr, &buf))
			for sc.Scan() {
				// The banner's last line: this one is serving.
				if strings.Contains(sc.Text(), "provisioned agents:") {
					o.serving = true
					go io.Copy(io.Discard, stderr)
					return
				}
			}
			err := o.cmd.Wait()
			o.stderr = buf.String()
			if ee, ok := err.(*exec.ExitError); ok {
				o.code = ee.ExitCode()
			}
		}()
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		for _, o := range outcomes {
			if o.cmd.Process != nil {
				o.cmd.Process.Kill()
			}
		}
		t.Fatal("the kernels neither served nor exited within 60 s")
	}
	var winner *outcome
	for _, o := range outcomes {
		if o.serving {
			if winner != nil {
				t.Fatal("two kernels serve one database file")
			}
			winner = o
		}
	}
	if winner == nil {
		t.Fatalf("no kernel serves the database: %+v", outcomes)
	}
	defer winner.cmd.Process.Kill()
	for _, o := range outcomes {
		if o == winner {
			continue
		}
		want := fmt.Sprintf("%s is used by process %d", db, winner.cmd.Process.Pid)
		if o.code == 0 || !strings.Contains(o.stderr, want) || strings.Contains(o.stderr, "already exists") {
			t.Fatalf("a second kernel: exit %d, stderr %q; want a refusal saying %q", o.code, o.stderr, want)
		}
	}

	// kill -9 releases the file: the next kernel starts on it.
	winner.cmd.Process.Signal(syscall.SIGKILL)
	winner.cmd.Wait()
	k := kt.Start(t, kt.Options{DB: db})
	k.NewAgent("after-kill", "")
	k.Must(200, k.Do("GET", "/v0/agents/after-kill", nil, nil))
}
