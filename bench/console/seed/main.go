// Command seed writes the SQLite database the console's measurements read
// (bench/console/run.ts): many ended executions of one agent, for the list,
// and one completed execution with many steps, for the timeline. It goes
// through the kernel's own verbs, in process, so the rows are exactly what
// a running kernel would have written.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// agentID owns every seeded execution; its webhook leads nowhere, and
// nothing seeded is left for a dispatcher to deliver.
const agentID = "seeded"

func main() {
	db := flag.String("db", "", "the database file to write (must not exist)")
	executions := flag.Int("executions", 10000, "ended executions for the list")
	steps := flag.Int("steps", 10000, "steps of the long execution")
	flag.Parse()
	if *db == "" {
		fmt.Fprintln(os.Stderr, "usage: seed -db FILE [-executions N] [-steps N]")
		os.Exit(2)
	}
	if _, err := os.Stat(*db); err == nil {
		fmt.Fprintf(os.Stderr, "seed: %s exists\n", *db)
		os.Exit(2)
	}
	long, err := seed(*db, *executions, *steps)
	if err != nil {
		fmt.Fprintln(os.Stderr, "seed:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{"executions": *executions, "long_execution_id": long, "steps": *steps})
}

func seed(path string, executions, steps int) (string, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sqlite.Open(sqlite.Options{Path: path, Logger: quiet})
	if err != nil {
		return "", err
	}
	defer st.Close()
	k := kernel.New(kernel.Options{Store: st, Clock: clock.Real{}, Config: kernel.DefaultConfig(), Logger: quiet})
	ctx := context.Background()
	if _, err := k.RegisterAgent(ctx, kernel.AgentSpec{ID: agentID, WebhookURL: "http://127.0.0.1:1/nowhere", Secret: "seeded-agent-secret"}); err != nil {
		return "", err
	}
	long, err := longExecution(ctx, k, st, steps)
	if err != nil {
		return "", fmt.Errorf("the long execution: %w", err)
	}
	return long, endedExecutions(ctx, k, executions)
}

// endedExecutions creates and cancels n executions, many at once so that
// their commits share fsyncs.
func endedExecutions(ctx context.Context, k *kernel.Kernel, n int) error {
	const workers = 32
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				e, err := k.CreateExecution(ctx, kernel.CreateRequest{AgentID: agentID, Input: fmt.Appendf(nil, `{"n":%d}`, i)})
				if err == nil {
					err = k.CancelExecution(ctx, e.ID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		select {
		case jobs <- i:
		case err := <-errs:
			close(jobs)
			return err
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// longExecution runs one execution through steps tool steps and completes
// it, as an agent would: claim and ack its dispatch, then submit and
// complete each step under that lease.
func longExecution(ctx context.Context, k *kernel.Kernel, st store.Store, steps int) (string, error) {
	e, err := k.CreateExecution(ctx, kernel.CreateRequest{AgentID: agentID, Input: []byte(`{"task":"many steps"}`)})
	if err != nil {
		return "", err
	}
	del, err := k.ClaimDispatch(ctx, store.DispatchRef{ID: e.DispatchID, ExecutionID: e.ID, AgentID: agentID})
	if err != nil || del == nil {
		return "", fmt.Errorf("claim: %v", err)
	}
	if err := k.RecordDelivery(ctx, del, kernel.DeliveryOutcome{Acked: true, HTTPStatus: 200}); err != nil {
		return "", err
	}
	agent := kernel.Caller{Agent: agentID}
	h := kernel.DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
	for i := range steps {
		args := fmt.Appendf(nil, `{"n":%d}`, i)
		v, _ := jsonx.Parse(args, wire.MaxNesting)
		d, err := k.SubmitStep(ctx, agent, e.ID, h, kernel.SubmitRequest{Kind: wire.KindToolCall, Target: "echo", Args: args, ArgsValue: v})
		if err != nil || d.Decision != wire.DecisionProceed {
			return "", fmt.Errorf("submit %d: %v %+v", i, err, d)
		}
		if _, err := k.RecordOutcome(ctx, agent, e.ID, d.StepID, h, kernel.OutcomeRequest{Succeeded: true, Value: args}); err != nil {
			return "", fmt.Errorf("complete %d: %w", i, err)
		}
	}
	return e.ID, k.CompleteExecution(ctx, agent, e.ID, h, kernel.CompleteRequest{Output: fmt.Appendf(nil, `{"steps":%d}`, steps)})
}
