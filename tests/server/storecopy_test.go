package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// `rebuno store copy` moves a dev database into server mode with nothing
// lost: every execution's events, steps, dispatch, resources and
// checkpoints, every agent with its secret, approval, API key and audit
// entry read the same from the destination as from the source, and a
// server on the destination carries on where the dev kernel stopped.
func TestStoreCopy(t *testing.T) {
	db := filepath.Join(t.TempDir(), "dev.db")
	dev := kt.Start(t, kt.Options{DB: db, Token: token, Args: []string{"--dispatch-timeout", "3s"}})
	f := newFront(t, dev.URL)

	// Executions of the Python SDK agent: steps, a workspace resource with
	// its checkpoints, an at_most_once step; and forks of some of them,
	// whose copies share their source's bodies.
	py := startPyAgent(t, "copy-agent", dev.URL)
	py.register(t, f, matrixLease)
	done := f.createBatch(t, py.ID, 0, 6)
	f.awaitFinished(t, done)
	forks, _ := forkMany(t, f, done[:3])
	f.awaitFinished(t, forks)

	// A raw agent leaves executions in every other state: blocked on an
	// approval, resumed by a granted one, and running with a step open.
	a := dev.NewAgent("copy-gated", `"lease_timeout_seconds":600`)
	dev.Must(204, dev.Do("POST", "/v0/policies/copy-gated", []byte(`{"bundle":"default_action: allow\nrules:\n  - id: gate\n    when: {target: pay}\n    then: {decision: require_approval}\n"}`), nil))
	gated := func() (string, string) {
		id := dev.CreateExecution(a.ID, `{}`)
		lease := kt.LeaseOf(a.NextWebhook())
		d := a.Submit(id, lease, `{"kind":"tool_call","target":"pay","args":{"amount":3}}`)
		if d.Decision != "blocked" {
			t.Fatalf("gated submit: %+v", d)
		}
		return id, d.ApprovalID
	}
	gated()
	_, granted := gated()
	dev.Must(204, dev.Do("POST", "/v0/approvals/"+granted+"/grant", []byte(`{"decided_by":"alice","rationale":"fine"}`), nil))
	a.NextWebhook()
	running := dev.Must(201, dev.Do("POST", "/v0/executions", []byte(`{"agent_id":"copy-gated","input":{"open":true}}`),
		map[string]string{"Idempotency-Key": "open-one"})).Map(t)["id"].(string)
	lease := kt.LeaseOf(a.NextWebhook())
	open := a.Submit(running, lease, `{"kind":"tool_call","target":"search","args":{"q":"x"}}`)

	// Keys, and the audit log they write.
	var key struct{ Token string }
	json.Unmarshal(dev.Must(201, dev.Do("POST", "/v0/keys", []byte(`{"name":"ops","role":"operator"}`), nil)).Body, &key)
	dev.Must(201, dev.Do("POST", "/v0/keys", []byte(`{"name":"gone","role":"viewer"}`), nil))
	dev.Must(204, dev.Do("DELETE", "/v0/keys/gone", nil, nil))

	// The source in use is refused.
	url := pgtest.NewEmptyDatabase(t)
	code, _, stderr, _ := command(t, 60*time.Second, "store", "copy", "--from", "sqlite:"+db, "--to", url)
	if code != 1 || !strings.Contains(stderr, "in use") {
		t.Fatalf("copy of a database in use: exit %d, %q; want 1 saying it is in use", code, stderr)
	}
	dev.Stop()

	code, stdout, stderr, _ := command(t, 60*time.Second, "store", "copy", "--from", "sqlite:"+db, "--to", url)
	if code != 0 || !strings.Contains(stdout, "executions") {
		t.Fatalf("store copy: exit %d, %q %q", code, stdout, stderr)
	}
	compareStores(t, db, url)

	// A second copy finds the destination full, and with --force fails on
	// the first key it finds taken; either way nothing changes.
	code, _, stderr, _ = command(t, 60*time.Second, "store", "copy", "--from", "sqlite:"+db, "--to", url)
	if code != 1 || !strings.Contains(stderr, "not empty") {
		t.Errorf("copy into a full database: exit %d, %q; want 1 saying it is not empty", code, stderr)
	}
	code, _, stderr, _ = command(t, 60*time.Second, "store", "copy", "--force", "--from", "sqlite:"+db, "--to", url)
	if code != 1 || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("a forced copy over the same rows: exit %d, %q; want 1 saying nothing was written", code, stderr)
	}
	compareStores(t, db, url)

	// A server on the destination finishes what the dev kernel left open,
	// and accepts the keys it issued.
	server := kt.Start(t, kt.Options{DBURL: url, Token: token})
	via := a.Via(server)
	via.Complete(running, open.StepID, lease, `{"found":1}`)
	via.Finish(running, lease, `{"done":true}`)
	if st := server.Execution(running)["status"]; st != "completed" {
		t.Errorf("the execution left running: %v after the server finished it", st)
	}
	r := server.Do("GET", "/v0/whoami", nil, map[string]string{"Authorization": "Bearer " + key.Token})
	if r.Status != 200 || !strings.Contains(string(r.Body), `"operator"`) {
		t.Errorf("a key issued by the dev kernel, on the server: %s", r)
	}
}

// compareStores reads everything the kernel keeps from the SQLite file and
// the Postgres database and fails on any difference.
func compareStores(t *testing.T, db, url string) {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	src, err := sqlite.Open(sqlite.Options{Path: db, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := postgres.Open(ctx, postgres.Options{URL: url, Logger: quiet, MaxConns: postgres.MinMaxConns})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	a, b := src.Read(), dst.Read()
	const all = 1 << 20
	same := func(what string, get func(r store.Reader) (any, error)) {
		t.Helper()
		x, err := get(a)
		if err != nil {
			t.Fatalf("%s from the source: %v", what, err)
		}
		y, err := get(b)
		if err != nil {
			t.Fatalf("%s from the destination: %v", what, err)
		}
		if !reflect.DeepEqual(x, y) {
			t.Errorf("%s differs:\n source      %s\n destination %s", what, show(x), show(y))
		}
	}
	execs, err := a.ListExecutions(ctx, store.ExecutionFilter{Limit: all})
	if err != nil {
		t.Fatal(err)
	}
	if len(execs) < 12 {
		t.Fatalf("the source holds %d executions; the scenario made more", len(execs))
	}
	same("the executions", func(r store.Reader) (any, error) { return r.ListExecutions(ctx, store.ExecutionFilter{Limit: all}) })
	checkpoints, forked := 0, 0
	for _, e := range execs {
		id := e.ID
		same("execution "+id, func(r store.Reader) (any, error) { return r.Execution(ctx, id) })
		same("the events of "+id, func(r store.Reader) (any, error) { return r.Events(ctx, id, 0, all) })
		same("the steps of "+id, func(r store.Reader) (any, error) { return r.Steps(ctx, id, nil, 0, all) })
		steps, _ := a.Steps(ctx, id, nil, 0, all)
		for _, st := range steps {
			same("the occurrence counter of "+st.StepID, func(r store.Reader) (any, error) {
				n, found, err := r.Counter(ctx, id, st.DispatchID, st.Kind, st.Target, st.ArgsHash)
				return [2]any{n, found}, err
			})
		}
		same("the resources of "+id, func(r store.Reader) (any, error) { return r.Resources(ctx, id) })
		same("the checkpoints of "+id, func(r store.Reader) (any, error) { return r.Checkpoints(ctx, id) })
		same("the bodies "+id+" shares", func(r store.Reader) (any, error) {
			refs, err := r.CopyRefs(ctx, id) // in no particular order
			slices.SortFunc(refs, func(x, y [2]string) int { return strings.Compare(x[0]+x[1], y[0]+y[1]) })
			return refs, err
		})
		same("the approvals of "+id, func(r store.Reader) (any, error) {
			return r.ListApprovals(ctx, store.ApprovalFilter{ExecutionID: id, Limit: all})
		})
		if e.DispatchID != "" {
			same("the dispatch of "+id, func(r store.Reader) (any, error) { return r.Dispatch(ctx, e.DispatchID) })
		}
		if e.IdempotencyKey != "" {
			route, scope := "create", ""
			if e.ForkedFrom != "" {
				route, scope = "fork", e.ForkedFrom
			}
			same("the idempotency key of "+id, func(r store.Reader) (any, error) { return r.Idempotency(ctx, route, scope, e.IdempotencyKey) })
		}
		cps, _ := a.Checkpoints(ctx, id)
		checkpoints += len(cps)
		if e.ForkedFrom != "" {
			forked++
		}
	}
	if checkpoints == 0 || forked == 0 {
		t.Fatalf("the source holds %d checkpoints and %d forks; the scenario made some", checkpoints, forked)
	}
	same("the agents", func(r store.Reader) (any, error) { return r.ListAgents(ctx) })
	same("the approvals", func(r store.Reader) (any, error) { return r.ListApprovals(ctx, store.ApprovalFilter{Limit: all}) })
	same("the API keys", func(r store.Reader) (any, error) { return r.ListAPIKeys(ctx) })
	same("the audit log", func(r store.Reader) (any, error) { return r.AuditLog(ctx, 0, all) })
	same("the deployment id", func(r store.Reader) (any, error) { return r.Setting(ctx, "deployment") })
	agents, _ := a.ListAgents(ctx)
	for _, ag := range agents {
		if ag.Secret == "" {
			t.Errorf("agent %s has no secret in the source", ag.ID)
		}
	}
	if keys, _ := a.ListAPIKeys(ctx); len(keys) != 2 {
		t.Errorf("the source holds %d keys, want 2", len(keys))
	}
}

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	if len(b) > 2000 {
		return string(b[:2000]) + "…"
	}
	return string(b)
}
