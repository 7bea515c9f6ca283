package kernel

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// forkView reads an in-place fork (fork_inplace.go) as if its source's
// history had been copied into it (docs/protocol/forks.md §3): its log's
// positions 3…kept+2 are the source's kept events, renumbered, their step
// ids the fork's; its steps' orders 1…steps are the source's copied steps,
// renumbered. Everything after those is the fork's own rows. Every read of
// an execution's events or steps goes through the kernel functions below,
// which pass straight to the store for any other execution.
type forkView struct {
	id, source  string
	at          int64
	kept, steps int64
	x           *exclusions
	created     time.Time // when the fork was created: the time of the events it shows for the rows read in place
	segments    []segment
}

// segment is a stretch of an in-place fork's log read from its source: the
// kept events (span nil), or the events of a key's checkpoints read in
// place (span). The positions around them are the fork's own events.
type segment struct {
	from, to int64
	span     *carriedSpan
}

func newForkView(e *store.Execution, x *exclusions) *forkView {
	v := &forkView{id: e.ID, source: e.ForkedFrom, at: e.ForkSeq, kept: e.ForkKept, steps: e.ForkSteps, x: x, created: e.CreatedAt}
	if v.kept > 0 {
		v.segments = append(v.segments, segment{from: 3, to: 2 + v.kept})
	}
	for i := range x.Carried {
		c := &x.Carried[i]
		v.segments = append(v.segments, segment{from: c.At, to: c.At + c.Rows - 1, span: c})
	}
	return v
}

// carried is the span of key's checkpoints read in place, nil when none.
func (v *forkView) carried(key string) *carriedSpan {
	for i := range v.x.Carried {
		if v.x.Carried[i].Key == key {
			return &v.x.Carried[i]
		}
	}
	return nil
}

// views remembers which executions are in-place forks: it never changes
// for an execution, and the stream tails ask on every page.
type views struct {
	mu sync.Mutex
	m  map[string]*forkView // nil: not an in-place fork
}

const viewsCap = 10000

// viewOf returns the view of e, nil when e is not an in-place fork.
func (k *Kernel) viewOf(ctx context.Context, rd store.Reader, e *store.Execution) (*forkView, error) {
	if !e.ForkInPlace {
		return nil, nil
	}
	return k.viewByID(ctx, rd, e.ID)
}

// viewByID is viewOf for an execution known by its id.
func (k *Kernel) viewByID(ctx context.Context, rd store.Reader, id string) (*forkView, error) {
	k.views.mu.Lock()
	v, ok := k.views.m[id]
	k.views.mu.Unlock()
	if ok {
		return v, nil
	}
	// The head first: only an in-place fork needs what is kept beside the
	// input (its exclusions), and an input may be large.
	e, err := rd.ExecutionHead(ctx, id)
	if err != nil {
		return nil, err
	}
	if e.ForkInPlace {
		if e, err = rd.Execution(ctx, id); err != nil {
			return nil, err
		}
		x, err := decodeExclusions(e.ForkExcluded)
		if err != nil {
			return nil, err
		}
		v = newForkView(e, x)
	}
	k.views.mu.Lock()
	if k.views.m == nil || len(k.views.m) >= viewsCap {
		k.views.m = map[string]*forkView{}
	}
	k.views.m[id] = v
	k.views.mu.Unlock()
	return v, nil
}

// readEvents pages an execution's log (store.Reader.Events). An in-place
// fork's is its own events around the segments read from its source.
func (k *Kernel) readEvents(ctx context.Context, rd store.Reader, v *forkView, id string, after int64, limit int) ([]*store.Event, error) {
	if v == nil {
		return rd.Events(ctx, id, after, limit)
	}
	var out []*store.Event
	for len(out) < limit {
		pos := after + 1
		var in *segment
		next := int64(0) // where the next segment after pos begins, 0 when none does
		for i := range v.segments {
			sg := &v.segments[i]
			if pos > sg.to {
				continue
			}
			if pos >= sg.from {
				in = sg
			} else {
				next = sg.from
			}
			break
		}
		if in != nil {
			to := min(in.to, after+int64(limit-len(out)))
			evs, err := k.segmentEvents(ctx, rd, v, in, pos, to)
			if err != nil {
				return nil, err
			}
			out = append(out, evs...)
			after = to
			continue
		}
		// Own events: every position up to the next segment is one.
		n := limit - len(out)
		if next != 0 {
			n = min(n, int(next-pos))
		}
		own, err := rd.Events(ctx, id, after, n)
		if err != nil {
			return nil, err
		}
		out = append(out, own...)
		if next == 0 || len(own) < n {
			break // the end of the log, or the fork is being deleted
		}
		after = own[len(own)-1].Seq
	}
	return out, nil
}

// segmentEvents renders the fork's positions from…to of one segment.
func (k *Kernel) segmentEvents(ctx context.Context, rd store.Reader, v *forkView, sg *segment, from, to int64) ([]*store.Event, error) {
	if sg.span == nil {
		return k.keptEvents(ctx, rd, v, from, to)
	}
	rows, err := k.carriedRows(ctx, rd, v, sg.span)
	if err != nil {
		return nil, err
	}
	out := make([]*store.Event, 0, to-from+1)
	for pos := from; pos <= to; pos++ {
		out = append(out, &store.Event{ExecutionID: v.id, Seq: pos, Type: EventResourceCheckpointed,
			Payload: checkpointedPayload(rows[pos-sg.span.At]).Bytes(), OccurredAt: v.created})
	}
	return out, nil
}

// carriedRows are the checkpoint rows of a span as the fork shows them:
// their seqs mapped, of rows that map to one position the last, no kept
// counts (the fork keeps no marks).
func (k *Kernel) carriedRows(ctx context.Context, rd store.Reader, v *forkView, span *carriedSpan) ([]*store.Checkpoint, error) {
	rows, err := rd.CheckpointRange(ctx, v.source, span.Key, 0, span.UpTo)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	out := carryRows(v.id, nil, rows, v.at, func(seq, kept int64) int64 { return forkSeqKept(kept, v.x, seq) })
	if int64(len(out)) != span.Rows {
		return nil, fmt.Errorf("fork %s: %d checkpoints of %q read in place, want %d", v.id, len(out), span.Key, span.Rows)
	}
	return out, nil
}

// checkpointRows lists an execution's checkpoint rows by key, then
// covered_seq (store.Reader.Checkpoints), an in-place fork's read in place
// included.
func (k *Kernel) checkpointRows(ctx context.Context, rd store.Reader, v *forkView, id string) ([]*store.Checkpoint, error) {
	own, err := rd.Checkpoints(ctx, id)
	if err != nil || v == nil || len(v.x.Carried) == 0 {
		return own, err
	}
	var out []*store.Checkpoint
	for i := range v.x.Carried {
		rows, err := k.carriedRows(ctx, rd, v, &v.x.Carried[i])
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	// A key's rows read in place all come before its own.
	out = append(out, own...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// checkpointAt is the newest checkpoint of key with covered_seq <= seq
// (store.Reader.CheckpointAt), an in-place fork's read in place included.
func (k *Kernel) checkpointAt(ctx context.Context, rd store.Reader, v *forkView, id, key string, seq int64) (*store.Checkpoint, error) {
	c, err := rd.CheckpointAt(ctx, id, key, seq)
	if v == nil || !errors.Is(err, store.ErrNotFound) {
		return c, err
	}
	span := v.carried(key)
	if span == nil {
		return nil, err
	}
	rows, err := k.carriedRows(ctx, rd, v, span)
	if err != nil {
		return nil, err
	}
	for i := len(rows) - 1; i >= 0; i-- {
		if rows[i].CoveredSeq <= seq {
			return rows[i], nil
		}
	}
	return nil, store.ErrNotFound
}

// keptEvents renders the fork's positions from…to (within 3…kept+2) from
// the source's log.
func (k *Kernel) keptEvents(ctx context.Context, rd store.Reader, v *forkView, from, to int64) ([]*store.Event, error) {
	// The keepable ordinal of the source event at position from: its rank
	// among the kept, moved past the excluded ordinals at or before it.
	ord := from - 3
	for _, x := range v.x.Kept {
		if x > ord {
			break
		}
		ord++
	}
	seq, err := seqOfKept(ctx, rd, v.source, ord, v.at)
	if err != nil {
		return nil, err
	}
	out := make([]*store.Event, 0, to-from+1)
	pos := from
	for cursor := seq - 1; pos <= to && cursor < v.at; {
		page, err := rd.Events(ctx, v.source, cursor, wire.MaxEventsLimit)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		start := len(out)
		for _, ev := range page {
			cursor = ev.Seq
			if ev.Seq > v.at || pos > to {
				break
			}
			if !keepable(ev.Type) || excluded(v.x.Seqs, ev.Seq) {
				continue
			}
			out = append(out, &store.Event{ExecutionID: v.id, Seq: pos, Type: ev.Type, Payload: ev.Payload, OccurredAt: ev.OccurredAt})
			pos++
		}
		if err := k.rewriteStepIDs(ctx, rd, v, out[start:]); err != nil {
			return nil, err
		}
	}
	if pos <= to {
		return nil, fmt.Errorf("fork %s: the source's log ends before position %d", v.id, pos)
	}
	return out, nil
}

// rewriteStepIDs gives events of the source's steps the fork's step ids
// (docs/protocol/forks.md §3), from the steps' identities read in one batch.
func (k *Kernel) rewriteStepIDs(ctx context.Context, rd store.Reader, v *forkView, evs []*store.Event) error {
	var ids []string
	seen := map[string]bool{}
	for _, ev := range evs {
		if id := string(textField(ev.Payload, "step_id")); id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	steps, err := rd.StepsByID(ctx, v.source, ids)
	if err != nil {
		return fmt.Errorf("read steps: %w", err)
	}
	to := make(map[string]string, len(steps))
	for _, s := range steps {
		to[s.StepID] = identity.StepID(v.id, s.Kind, s.Target, s.ArgsHash, s.Occurrence)
	}
	for _, ev := range evs {
		ev.Payload = rewriteStepID(ev.Payload, to)
	}
	return nil
}

func excluded(sorted []int64, x int64) bool {
	i := sort.Search(len(sorted), func(i int) bool { return sorted[i] >= x })
	return i < len(sorted) && sorted[i] == x
}

// seqOfKept is the seq of the source's keepable event with ordinal ord
// (the ord+1-th), at or before at: a binary search over the runs by their
// marks, then a walk inside one run.
func seqOfKept(ctx context.Context, rd store.Reader, source string, ord, at int64) (int64, error) {
	for lo, hi := int64(1), at; lo <= hi; {
		run, err := rd.EventRun(ctx, source, (lo+hi)/2)
		if err != nil {
			return 0, fmt.Errorf("read events: %w", err)
		}
		if run.Mark == nil {
			return 0, fmt.Errorf("a run of %s has no mark", source)
		}
		if run.Mark.Kept > ord {
			hi = run.FirstSeq - 1
			continue
		}
		m := run.Mark
		for _, ev := range run.Events {
			if keepable(ev.Type) {
				if m.Kept == ord {
					return ev.Seq, nil
				}
			}
			if m, err = advanceMark(m, ev.Type, ev.Payload); err != nil {
				return 0, err
			}
		}
		lo = run.LastSeq + 1
	}
	return 0, fmt.Errorf("%s has no keepable event %d at or before seq %d", source, ord, at)
}

// seqMapper maps source seqs to the fork's numbering (docs/protocol/forks.md §3), keeping the
// last run it read: a page of steps maps seqs that mostly share runs.
type seqMapper struct {
	rd  store.Reader
	v   *forkView
	run *store.EventRun
}

func (m *seqMapper) mapSeq(ctx context.Context, x int64) (int64, error) {
	if x < 1 {
		return 0, nil
	}
	if m.run == nil || x < m.run.FirstSeq || x > m.run.LastSeq {
		run, err := m.rd.EventRun(ctx, m.v.source, x)
		if err != nil {
			return 0, fmt.Errorf("read events: %w", err)
		}
		if run.Mark == nil {
			return 0, fmt.Errorf("a run of %s has no mark", m.v.source)
		}
		m.run = run
	}
	after, err := markThrough(m.run, x)
	if err != nil {
		return 0, err
	}
	return forkSeq(after, m.v.x, x), nil
}

// present is a copied source step as the fork shows it: the fork's id and
// order, its seqs mapped, its bodies the source's, never started in the
// fork (as a copy would be, fork.go).
func (m *seqMapper) present(ctx context.Context, s *store.Step, order int64) (*store.Step, error) {
	c := *s
	c.ExecutionID = m.v.id
	c.StepID = identity.StepID(m.v.id, s.Kind, s.Target, s.ArgsHash, s.Occurrence)
	c.Order = order
	var err error
	if c.TerminalSeq, err = m.mapSeq(ctx, s.TerminalSeq); err != nil {
		return nil, err
	}
	if c.SubmittedSeq, err = m.mapSeq(ctx, s.SubmittedSeq); err != nil {
		return nil, err
	}
	if s.BodyStepID == "" {
		c.BodyExecutionID, c.BodyStepID = s.ExecutionID, s.StepID
	}
	c.DispatchID, c.Attempt, c.StartInfo = "", 0, nil
	return &c, nil
}

// forkOrder is the fork's order of a copied source step.
func (v *forkView) forkOrder(sourceOrder int64) int64 {
	return sourceOrder - int64(sort.Search(len(v.x.Orders), func(i int) bool { return v.x.Orders[i] >= sourceOrder }))
}

// sourceOrder is the source order of the fork's copied step at order n.
func (v *forkView) sourceOrder(n int64) int64 {
	for _, x := range v.x.Orders {
		if x > n {
			break
		}
		n++
	}
	return n
}

var copiedStatuses = []string{wire.StepSucceeded, wire.StepFailed, wire.StepDenied}

// readSteps pages an execution's steps (store.Reader.Steps).
func (k *Kernel) readSteps(ctx context.Context, rd store.Reader, v *forkView, id string, statuses []string, after int64, limit int) ([]*store.Step, error) {
	if v == nil {
		return rd.Steps(ctx, id, statuses, after, limit)
	}
	var out []*store.Step
	if after < v.steps {
		want := copiedStatuses
		if len(statuses) > 0 {
			want = nil
			for _, s := range statuses {
				if contains(copiedStatuses, s) {
					want = append(want, s)
				}
			}
		}
		m := &seqMapper{rd: rd, v: v}
		for cursor := v.sourceOrder(after+1) - 1; len(want) > 0 && len(out) < limit; {
			n := limit - len(out) + len(v.x.Orders)
			page, err := rd.Steps(ctx, v.source, want, cursor, n)
			if err != nil {
				return nil, err
			}
			done := len(page) < n
			for _, s := range page {
				cursor = s.Order
				if excluded(v.x.Orders, s.Order) {
					continue
				}
				order := v.forkOrder(s.Order)
				if order > v.steps || len(out) == limit {
					done = true
					break
				}
				c, err := m.present(ctx, s, order)
				if err != nil {
					return nil, err
				}
				out = append(out, c)
			}
			if done {
				break
			}
		}
		after = v.steps
		if len(out) == limit {
			return out, nil
		}
	}
	own, err := rd.Steps(ctx, id, statuses, after, limit-len(out))
	if err != nil {
		return nil, err
	}
	return append(out, own...), nil
}

// readStep reads one step by its id (store.Reader.Step). A copied step of
// an in-place fork is found by hashing the copied steps' identities with
// the fork's id, a page at a time: the one read of a fork whose cost grows
// with its source's history, for a step the fork never ran.
func (k *Kernel) readStep(ctx context.Context, rd store.Reader, v *forkView, id, stepID string) (*store.Step, error) {
	s, err := rd.Step(ctx, id, stepID)
	if v == nil || !errors.Is(err, store.ErrNotFound) {
		return s, err
	}
	for after := int64(0); ; {
		page, err := rd.FinishedStepHeads(ctx, v.source, v.at, after, wire.StepsPageSize)
		if err != nil {
			return nil, err
		}
		for _, h := range page {
			after = h.Order
			if identity.StepID(v.id, h.Kind, h.Target, h.ArgsHash, h.Occurrence) == stepID && copiedAt(h, v.at) {
				full, err := rd.Step(ctx, v.source, h.StepID)
				if err != nil {
					return nil, err
				}
				full.SubmittedSeq = h.SubmittedSeq
				m := &seqMapper{rd: rd, v: v}
				return m.present(ctx, full, v.forkOrder(h.Order))
			}
		}
		if len(page) < wire.StepsPageSize {
			return nil, store.ErrNotFound
		}
	}
}

// copiedOccurrences are the source's copied steps of one identity, in
// occurrence order; nil for any execution but an in-place fork.
func (k *Kernel) copiedOccurrences(ctx context.Context, rd store.Reader, v *forkView, kind, target, argsHash string) ([]*store.Step, error) {
	if v == nil {
		return nil, nil
	}
	all, err := rd.StepsByIdentity(ctx, v.source, kind, target, argsHash)
	if err != nil {
		return nil, err
	}
	var out []*store.Step
	for _, s := range all {
		if copiedAt(s, v.at) {
			out = append(out, s)
		}
	}
	return out, nil
}

// stepForSubmit reads the step a submit names, by its id and identity: on
// an in-place fork a copied step is found by its identity in the source.
func (k *Kernel) stepForSubmit(ctx context.Context, rd store.Reader, v *forkView, id, stepID, kind, target, argsHash string, occ int64) (*store.Step, error) {
	s, err := rd.Step(ctx, id, stepID)
	if v == nil || !errors.Is(err, store.ErrNotFound) {
		return s, err
	}
	copies, err := k.copiedOccurrences(ctx, rd, v, kind, target, argsHash)
	if err != nil {
		return nil, err
	}
	for _, c := range copies {
		if c.Occurrence == occ {
			m := &seqMapper{rd: rd, v: v}
			return m.present(ctx, c, v.forkOrder(c.Order))
		}
	}
	return nil, store.ErrNotFound
}

// withCopiedOccurrences is the highest occurrence of an identity over an
// execution's own steps (highest, found: store.Occurrences) and,
// for an in-place fork, its copies.
func (k *Kernel) withCopiedOccurrences(ctx context.Context, rd store.Reader, v *forkView, kind, target, argsHash string, highest int64, found bool) (int64, bool, error) {
	if v == nil {
		return highest, found, nil
	}
	copies, err := k.copiedOccurrences(ctx, rd, v, kind, target, argsHash)
	if err != nil {
		return 0, false, err
	}
	for _, c := range copies {
		if !found || c.Occurrence > highest {
			highest, found = c.Occurrence, true
		}
	}
	return highest, found, nil
}

// hasIndeterminate is store.Reader.HasIndeterminate over the fork's own
// steps and its copies.
func (k *Kernel) hasIndeterminate(ctx context.Context, rd store.Reader, v *forkView, id, kind, target, argsHash string) (bool, error) {
	has, err := rd.HasIndeterminate(ctx, id, kind, target, argsHash)
	if err != nil || has || v == nil {
		return has, err
	}
	copies, err := k.copiedOccurrences(ctx, rd, v, kind, target, argsHash)
	if err != nil {
		return false, err
	}
	for _, c := range copies {
		if c.Status == wire.StepFailed && c.ErrorReason == wire.ReasonIndeterminate {
			return true, nil
		}
	}
	return false, nil
}

// finishedStepHeads is store.Reader.FinishedStepHeads for any execution,
// an in-place fork's copies included (forking one copies what it shows).
func (k *Kernel) finishedStepHeads(ctx context.Context, rd store.Reader, v *forkView, id string, upTo, after int64, limit int) ([]*store.Step, error) {
	if v == nil {
		return rd.FinishedStepHeads(ctx, id, upTo, after, limit)
	}
	var out []*store.Step
	for len(out) < limit {
		page, err := k.readSteps(ctx, rd, v, id, copiedStatuses, after, limit)
		if err != nil {
			return nil, err
		}
		for _, s := range page {
			after = s.Order
			if s.TerminalSeq >= 1 && s.TerminalSeq <= upTo && len(out) < limit {
				h := *s
				h.Args, h.Result, h.Error, h.DispatchID, h.Attempt, h.StartInfo = nil, nil, nil, "", 0, nil
				out = append(out, &h)
			}
		}
		if len(page) < limit {
			break
		}
	}
	return out, nil
}
