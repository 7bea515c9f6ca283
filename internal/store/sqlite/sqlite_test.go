package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/storetest"
	"github.com/rebuno/rebuno/internal/wire"
)

// quietLogger drops the store's log lines.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openAt(t testing.TB, path string, obs Observer) *Store {
	t.Helper()
	s, err := Open(Options{Path: path, Observer: obs, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openFile(t *testing.T) store.Store {
	return openAt(t, filepath.Join(t.TempDir(), "rebuno.db"), nil)
}

func openMemory(t *testing.T) store.Store {
	return openAt(t, ":memory:", nil)
}

func reopenFile(t *testing.T, s store.Store) store.Store {
	t.Helper()
	path := s.(*Store).Path()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return openAt(t, path, nil)
}

func TestContractFile(t *testing.T) { storetest.Run(t, openFile) }

func TestContractMemory(t *testing.T) { storetest.Run(t, openMemory) }

func TestDurability(t *testing.T) { storetest.RunDurability(t, openFile, reopenFile) }

func schemaVersions(t *testing.T, path string) []int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT version FROM schema_version`)
	if err != nil {
		t.Fatalf("read schema_version: %v", err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSchemaVersionRecorded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rebuno.db")
	for round := range 3 {
		s := openAt(t, path, nil)
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if got := schemaVersions(t, path); !slices.Equal(got, []int{len(migrations)}) {
			t.Fatalf("schema_version after opening %d times: %v, want one row %d", round+1, got, len(migrations))
		}
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rebuno.db")
	s := openAt(t, path, nil)
	if err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertExecution(ctx, &store.Execution{ID: "kept", AgentID: "a", Input: []byte("null"), Status: wire.ExecPending, CreatedAt: time.Now(), UpdatedAt: time.Now()})
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	if _, err := db.Exec(`UPDATE schema_version SET version = 999`); err != nil {
		t.Fatalf("set schema version: %v", err)
	}
	db.Close()

	s2, err := Open(Options{Path: path, Logger: quietLogger()})
	if err == nil {
		s2.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
	for _, want := range []string{"999", "newer", fmt.Sprint(len(migrations))} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// The refusal changed nothing.
	if got := schemaVersions(t, path); !slices.Equal(got, []int{999}) {
		t.Errorf("schema_version after the refusal: %v, want [999]", got)
	}
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	return st.Mode().Perm()
}

func TestFileModes(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "missing", "nested", "rebuno.db")
	s := openAt(t, path, nil)
	if err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		return tx.UpsertAgent(ctx, &store.Agent{ID: "a", WebhookURL: "http://x", Secret: "secret", RegisteredAt: time.Now(), UpdatedAt: time.Now()})
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	for _, dir := range []string{filepath.Join(root, "missing"), filepath.Join(root, "missing", "nested")} {
		if got := mode(t, dir); got != 0o700 {
			t.Errorf("folder %s: mode %v, want 0700", dir, got)
		}
	}
	// The database and its journal files hold agent secrets (docs/protocol/configuration.md §2).
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if got := mode(t, f); got != 0o600 {
			t.Errorf("%s: mode %v, want 0600", filepath.Base(f), got)
		}
	}
	if !s.Durable {
		t.Error("a file store reports itself not durable")
	}
}

func TestExistingFolderAndFileKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rebuno.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s, err := Open(Options{Path: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Open of an existing empty file: %v", err)
	}
	defer s.Close()
	if !strings.Contains(logs.String(), "readable by other users") {
		t.Errorf("no warning about a database readable by others; log: %q", logs.String())
	}
	// The store warns; it does not change modes it did not create.
	if got := mode(t, dir); got != 0o755 {
		t.Errorf("existing folder: mode %v, want 0755 kept", got)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func TestPathIsFolderRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Path: dir, Logger: quietLogger()})
	if err == nil {
		s.Close()
		t.Fatal("Open of a folder succeeded")
	}
	if !strings.Contains(err.Error(), "folder") {
		t.Errorf("error %q does not say the path is a folder", err)
	}
}

func TestMemoryLeavesNothing(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	s, err := Open(Options{Path: ":memory:", Logger: quietLogger()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if s.Durable {
		t.Error(":memory: store reports itself durable")
	}
	if err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertExecution(ctx, &store.Execution{ID: "e", AgentID: "a", Input: []byte("null"), Status: wire.ExecPending, CreatedAt: time.Now(), UpdatedAt: time.Now()})
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	tmp := s.Path()
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the throwaway database is not at %s: %v", tmp, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(tmp)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("throwaway folder %s still exists after Close (%v)", filepath.Dir(tmp), err)
	}
	entries, err := os.ReadDir(cwd)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf(":memory: left %d entries in the working folder, first %q", len(entries), entries[0].Name())
	}
}

func TestClose(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "rebuno.db"), nil)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Each refusal takes one of two paths (the closed stop signal or the
	// stopped writer); many calls cover both.
	var ran atomic.Bool
	for range 30 {
		err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error { ran.Store(true); return nil })
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Update after Close: got %v, want store.ErrUnavailable", err)
		}
	}
	if ran.Load() {
		t.Error("Update after Close ran its function")
	}
	if err := s.Ping(t.Context()); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping after Close: got %v, want store.ErrUnavailable", err)
	}
}

// TestCloseWithQueuedTransactions closes the store while transactions wait
// for the writer: Close runs them first, and their commits survive.
func TestCloseWithQueuedTransactions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rebuno.db")
	s := openAt(t, path, nil)
	release := holdWriter(t, s)
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
				return tx.InsertExecution(ctx, execRow(fmt.Sprintf("q-%02d", i)))
			})
		})
	}
	waitQueued(t, s, n)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	// Close waits for the running transaction.
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v while a transaction was running", err)
	default:
	}
	if err := release(); err != nil {
		t.Errorf("the running transaction: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()

	// Close runs what was queued before it; every queued Update committed.
	s2 := openAt(t, path, nil)
	for i, err := range errs {
		if err != nil {
			t.Errorf("q-%02d: Update queued before Close returned %v", i, err)
		}
		if _, err := s2.Read().Execution(t.Context(), fmt.Sprintf("q-%02d", i)); err != nil {
			t.Errorf("q-%02d: row after reopening: %v", i, err)
		}
	}
}

// batchRecorder is an Observer keeping every commit's batch size.
type batchRecorder struct {
	mu    sync.Mutex
	sizes []int
}

func (r *batchRecorder) ObserveCommit(n int, _ time.Duration) {
	r.mu.Lock()
	r.sizes = append(r.sizes, n)
	r.mu.Unlock()
}

func (r *batchRecorder) get() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes)
}

// holdWriter starts a transaction that keeps the writer busy until the
// returned release is called, so that later transactions queue up.
func holdWriter(t *testing.T, s *Store) (release func() error) {
	t.Helper()
	entered, free := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(context.Background(), "", func(ctx context.Context, tx store.Tx) error {
			close(entered)
			<-free
			return nil
		})
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the holding transaction did not start")
	}
	return func() error { close(free); return <-done }
}

func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.jobs) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d transactions queued", len(s.jobs), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func execRow(id string) *store.Execution {
	return &store.Execution{ID: id, AgentID: "a", Input: []byte(`{"n": 1}`), Status: wire.ExecRunning, CreatedAt: time.Now(), UpdatedAt: time.Now()}
}

// TestGroupCommitIsolatesUnits queues transactions behind a held one so that
// they share one commit, and checks that the failing ones (error, panic,
// constraint violation) roll back alone.
func TestGroupCommitIsolatesUnits(t *testing.T) {
	rec := &batchRecorder{}
	s := openAt(t, filepath.Join(t.TempDir(), "rebuno.db"), rec)
	if err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertExecution(ctx, execRow("existing"))
	}); err != nil {
		t.Fatal(err)
	}
	release := holdWriter(t, s)

	const n = 60
	errs := make([]error, n)
	var callbacks atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("unit-%02d", i)
			errs[i] = s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
				if err := tx.InsertExecution(ctx, execRow(id)); err != nil {
					return err
				}
				if err := tx.AppendEvents(ctx, []*store.Event{{ExecutionID: id, Seq: 1, Type: wire.EventExecutionCreated, Payload: []byte(`{}`), OccurredAt: time.Now()}}); err != nil {
					return err
				}
				tx.AfterCommit(func() { callbacks.Add(1) })
				switch i % 4 {
				case 1:
					return errors.New("deliberate")
				case 2:
					panic("deliberate panic")
				case 3:
					return tx.InsertExecution(ctx, execRow("existing"))
				}
				return nil
			})
		})
	}
	waitQueued(t, s, n)
	if err := release(); err != nil {
		t.Fatalf("holding transaction: %v", err)
	}
	wg.Wait()

	sizes := rec.get()
	if !slices.Equal(sizes[len(sizes)-2:], []int{1, n}) {
		t.Errorf("commit batch sizes %v: want the held transaction alone, then all %d queued ones in one commit", sizes, n)
	}
	ok := 0
	for i, err := range errs {
		id := fmt.Sprintf("unit-%02d", i)
		_, rerr := s.Read().Execution(t.Context(), id)
		evs, everr := s.Read().Events(t.Context(), id, 0, 10)
		if everr != nil {
			t.Fatal(everr)
		}
		if i%4 == 0 {
			ok++
			if err != nil || rerr != nil || len(evs) != 1 {
				t.Errorf("%s: Update %v, read %v, %d events; want committed", id, err, rerr, len(evs))
			}
			continue
		}
		if err == nil || !errors.Is(rerr, store.ErrNotFound) || len(evs) != 0 {
			t.Errorf("%s: Update %v, read %v, %d events; want rolled back", id, err, rerr, len(evs))
		}
	}
	if got := callbacks.Load(); got != int64(ok) {
		t.Errorf("AfterCommit ran %d times, want %d (committed units only)", got, ok)
	}
}

// TestGroupCommitMaxBatch checks that no commit takes more than MaxBatch
// transactions.
func TestGroupCommitMaxBatch(t *testing.T) {
	rec := &batchRecorder{}
	s := openAt(t, filepath.Join(t.TempDir(), "rebuno.db"), rec)
	release := holdWriter(t, s)
	const n = MaxBatch + 44
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range n {
		wg.Go(func() {
			if err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
				return tx.InsertExecution(ctx, execRow(fmt.Sprintf("e-%03d", i)))
			}); err != nil {
				failed.Add(1)
			}
		})
	}
	waitQueued(t, s, n)
	if err := release(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d updates failed", failed.Load())
	}
	if got := rec.get(); !slices.Equal(got, []int{1, MaxBatch, 44}) {
		t.Errorf("commit batch sizes %v, want [1 %d 44]", got, MaxBatch)
	}
	list, err := s.Read().ListExecutions(t.Context(), store.ExecutionFilter{Limit: 1000})
	if err != nil || len(list) != n {
		t.Errorf("executions stored: %d (%v), want %d", len(list), err, n)
	}
}

// TestCancelledWhileQueued checks that a transaction whose caller gives up
// before its turn never runs and says so.
func TestCancelledWhileQueued(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "rebuno.db"), nil)
	release := holdWriter(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	var ran atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
			ran.Store(true)
			return tx.InsertExecution(ctx, execRow("cancelled"))
		})
	}()
	waitQueued(t, s, 1)
	cancel()
	// The caller waits for the writer's verdict even though it gave up.
	select {
	case err := <-done:
		t.Fatalf("Update returned %v before the writer reached it", err)
	default:
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Update: got %v, want context.Canceled", err)
	}
	if ran.Load() {
		t.Error("the cancelled transaction ran")
	}
	if _, err := s.Read().Execution(t.Context(), "cancelled"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancelled transaction's row: %v, want not found", err)
	}
}

// BenchmarkGroupCommit measures durable small transactions per second with
// several concurrent writers.
func BenchmarkGroupCommit(b *testing.B) {
	for _, writers := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			rec := &batchRecorder{}
			s := openAt(b, filepath.Join(b.TempDir(), "rebuno.db"), rec)
			payload := []byte(`{"type":"step.succeeded","result":{"ok":true}}`)
			var next atomic.Int64
			var failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range writers {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						id := fmt.Sprintf("bench-%09d", i)
						err := s.Update(context.Background(), id, func(ctx context.Context, tx store.Tx) error {
							if err := tx.InsertExecution(ctx, execRow(id)); err != nil {
								return err
							}
							return tx.AppendEvents(ctx, []*store.Event{
								{ExecutionID: id, Seq: 1, Type: wire.EventExecutionCreated, Payload: payload, OccurredAt: time.Now()},
								{ExecutionID: id, Seq: 2, Type: wire.EventDispatchQueued, Payload: payload, OccurredAt: time.Now()},
							})
						})
						if err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if failed.Load() > 0 {
				b.Fatalf("%d transactions failed", failed.Load())
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tx/s")
			if sizes := rec.get(); len(sizes) > 0 {
				b.ReportMetric(float64(b.N)/float64(len(sizes)), "tx/commit")
			}
		})
	}
}

// TestLargeCommitCheckpointsAtOnce: a commit that writes more than
// largeCommitPages pages has the checkpointer run at once, without waiting
// for its tick (an hour here); a step-sized commit does not.
func TestLargeCommitCheckpointsAtOnce(t *testing.T) {
	checkpointed := make(chan struct{}, 16)
	checkpointHook = func() { checkpointed <- struct{}{} }
	path := filepath.Join(t.TempDir(), "rebuno.db")
	s, err := Open(Options{Path: path, Logger: quietLogger(), CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		checkpointHook = nil
	})
	ctx := t.Context()
	write := func(events int) {
		t.Helper()
		evs := make([]*store.Event, events)
		for i := range evs {
			evs[i] = &store.Event{ExecutionID: "e", Seq: int64(i + 1), Type: "step.proposed",
				Payload: []byte(`{"pad":"` + strings.Repeat("x", 2000) + `"}`), OccurredAt: time.Unix(1, 0)}
		}
		if err := s.Update(ctx, "e", func(ctx context.Context, tx store.Tx) error {
			if err := tx.DeleteExecution(ctx, "e"); err != nil {
				return err
			}
			return tx.AppendEvents(ctx, evs)
		}); err != nil {
			t.Fatal(err)
		}
	}

	write(4) // a few pages
	if n := s.soonAsked.Load(); n != 0 {
		t.Fatalf("a small commit asked for %d checkpoints", n)
	}
	write(4000) // about 8 MB: thousands of pages
	if n := s.soonAsked.Load(); n != 1 {
		t.Fatalf("a large commit asked for %d checkpoints, want 1", n)
	}
	select {
	case <-checkpointed:
	case <-time.After(30 * time.Second):
		t.Fatal("no checkpoint ran after the large commit")
	}
}

// One store per database file: a second Open is refused at once, naming the
// file and the holder's pid, and succeeds once the first is closed.
func TestOneStorePerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rebuno.db")
	s := openAt(t, path, nil)
	_, err := Open(Options{Path: path, Logger: quietLogger()})
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("second Open: %v, want ErrInUse", err)
	}
	for _, want := range []string{path, fmt.Sprintf("process %d", os.Getpid()), "--db"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(Options{Path: path, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s2.Close()
}
