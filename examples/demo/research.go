package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/cli"
)

// The story of `make demo-go`: the raw-HTTP Go agent (examples/go-agent)
// searches, fetches three pages and summarises; the demo kills it with
// SIGKILL in the middle of the second fetch, starts it again, and shows the
// recorded steps replaying instead of running twice.

// exampleAgent says how to start one of the example agents.
type exampleAgent struct {
	about   string
	command func(kernelURL, listen, id, secret string) *exec.Cmd
	// ready bounds the wait for the webhook port: an interpreter takes
	// longer to start than a Go binary.
	ready time.Duration
}

func goAgent(bin string) exampleAgent {
	return exampleAgent{
		about: "the Go example agent (examples/go-agent: raw HTTP, v1 signatures, no SDK)",
		command: func(kernelURL, listen, id, secret string) *exec.Cmd {
			return exec.Command(bin, "-kernel", kernelURL, "-listen", listen, "-id", id, "-secret", secret)
		},
		ready: 5 * time.Second,
	}
}

func runResearch(kernelBin string, example exampleAgent) error {
	dir, err := os.MkdirTemp("", "rebuno-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	say("Starting the kernel on a fresh SQLite file in %s", dir)
	k, err := startKernel(kernelBin, dir)
	if err != nil {
		return err
	}
	defer stop(k.cmd)

	addr, secret, err := k.registerAgent("researcher")
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	agent := &agentProcess{addr: addr, ready: example.ready, log: logFile,
		start: func() *exec.Cmd { return example.command(k.url, addr, "researcher", secret) }}
	say("Starting %s", example.about)
	if err := agent.run(); err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	defer func() { agent.stop() }()

	body, err := k.post("/v0/executions", `{"agent_id":"researcher","input":{"topic":"durable agents"}}`, 201)
	if err != nil {
		return fmt.Errorf("create execution: %w", err)
	}
	var created struct{ ID string }
	json.Unmarshal(body, &created)
	say("Created execution %s; following its event log:\n", created.ID)

	// Follow the execution with the CLI's own timeline (`rebuno exec watch`).
	// When the agent starts the second page fetch, kill it with SIGKILL and
	// start it again at once: the kernel redelivers when the lease lapses,
	// and the steps recorded before the crash replay instead of running twice.
	killed, reran := false, false
	fetches := 0
	var restartErr error
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	final, err := cli.Watch(ctx, created.ID, cli.WatchOptions{URL: k.url, Out: os.Stdout, Err: os.Stderr,
		OnEvent: func(ev cli.Event) {
			var p struct {
				Target string `json:"target"`
				Retry  bool   `json:"retry"`
			}
			json.Unmarshal(ev.Payload, &p)
			if ev.Type == "step.executing" && p.Retry {
				reran = true
			}
			if ev.Type != "step.executing" || p.Target != "fetch_page" || killed {
				return
			}
			if fetches++; fetches == 2 {
				killed = true
				agent.kill()
				fmt.Printf("\n    💥 kill -9 the agent in the middle of a step; starting it again. The kernel redelivers when the lease lapses.\n\n")
				restartErr = agent.run()
			}
		}})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	if restartErr != nil {
		return fmt.Errorf("restart agent: %w", restartErr)
	}
	fmt.Println()
	say("What the agent processes did (their log):")
	replays := 0
	for _, line := range agent.lines() {
		if i := strings.Index(line, ": "); i > 0 && (strings.Contains(line, " run ") || strings.Contains(line, " replay ") || strings.Contains(line, "attempt")) {
			fmt.Println("      " + line[i+2:])
			if strings.Contains(line, " replay ") {
				replays++
			}
		}
	}
	say("The steps recorded before the crash replayed from the log; only the interrupted one ran again.")
	switch {
	case final.Status != "completed":
		return fmt.Errorf("execution ended %s", final.Status)
	case !killed:
		return fmt.Errorf("the agent was never killed")
	case !reran:
		return fmt.Errorf("no step was re-run after the crash")
	case replays == 0:
		return fmt.Errorf("no step replayed after the crash")
	}
	return nil
}
