package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// ForkRequest is a parsed fork body.
type ForkRequest struct {
	AtSeq          int64
	IdempotencyKey string
	BodyHash       string
}

// cleanupReasons are the step denials of a terminal clean-up (docs/protocol/executions.md §9): a fork
// does not copy them, since the handler never saw those outcomes.
var cleanupReasons = map[string]bool{
	wire.CauseExecutionCompleted: true, wire.CauseExecutionFailed: true,
	wire.CauseExecutionCancelled: true, wire.CauseDeadlineExceeded: true,
}

// forkPlan is everything a fork copies from its source, read before the
// write transaction: what lies at or before the fork point never changes.
type forkPlan struct {
	id          string // the fork's id, chosen first so that the copies' step ids are known while reading
	source      *store.Execution
	at          int64
	steps       []*store.Step       // copied source steps, in recording order
	resources   []*store.Resource   // copied resources, in registration order
	checkpoints []*store.Checkpoint // copied source rows the fork writes, per key, by covered_seq
	written     []*store.Checkpoint // in place: those rows mapped (carryRows)
	ids         map[string]string   // source step id → the copy's
	kept        []*store.Event      // kept source events, in order, payloads already carrying the copies' step ids
	generations map[string]int64    // generation of each key at the fork point
	covered     map[string]bool     // coverage of each key at the fork point
	restoreAt   map[string]*store.Checkpoint
	idemKey     string       // the request's Idempotency-Key, shown on the fork (docs/protocol/executions.md §2)
	inPlace     *inPlacePlan // set when the fork reads its source in place; steps, ids and kept are then empty
}

// Fork creates a new execution from an execution's history up to an event
// (docs/protocol/forks.md): its completed steps replay, and its resources
// are restored from the checkpoint that covers the point, or the newest
// earlier one. The source is never modified.
func (k *Kernel) Fork(ctx context.Context, sourceID string, r ForkRequest) (*store.Execution, error) {
	started := time.Now()
	if r.IdempotencyKey != "" {
		if err := ValidIdempotencyKey(r.IdempotencyKey); err != nil {
			return nil, err
		}
	}
	source, err := k.store.Read().Execution(ctx, sourceID)
	if err != nil {
		return nil, notFoundOr(err, "execution")
	}
	if r.AtSeq < 1 || r.AtSeq > source.LastSeq {
		return nil, atSeqError(source.LastSeq)
	}
	plan, err := k.planFork(ctx, source, r.AtSeq)
	if err != nil {
		return nil, err
	}
	plan.idemKey = r.IdempotencyKey
	var fork *store.Execution
	err = k.update(ctx, sourceID, func(o *op) error {
		fork = nil
		if _, err := o.tx.ExecutionHead(o.ctx, sourceID); err != nil {
			return notFoundOr(err, "execution")
		}
		if _, err := o.tx.Agent(o.ctx, source.AgentID); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return errConflict(fmt.Sprintf("agent %q is not registered", source.AgentID))
			}
			return fmt.Errorf("read agent: %w", err)
		}
		if r.IdempotencyKey != "" {
			existing, err := k.idempotent(o, RouteFork, sourceID, r.IdempotencyKey, r.BodyHash)
			if err != nil || existing != nil {
				fork = existing
				return err
			}
		}
		var err error
		if fork, err = o.writeFork(plan); err != nil {
			return err
		}
		if r.IdempotencyKey != "" {
			if err := o.tx.InsertIdempotency(o.ctx, &store.IdempotencyRecord{Route: RouteFork, Scope: sourceID,
				Key: r.IdempotencyKey, BodyHash: r.BodyHash, ExecutionID: fork.ID, CreatedAt: o.now}); err != nil {
				return fmt.Errorf("record idempotency key: %w", err)
			}
		}
		covered := "true"
		for _, c := range plan.covered {
			if !c {
				covered = "false"
			}
		}
		m := k.metrics
		o.tx.AfterCommit(func() {
			m.Forks.WithLabelValues(covered).Inc()
			m.ForkDuration.Observe(time.Since(started).Seconds())
			m.ExecutionsCreated.Inc()
		})
		return nil
	})
	return fork, err
}

// planFork reads and selects what the fork copies (docs/protocol/forks.md §2).
func (k *Kernel) planFork(ctx context.Context, source *store.Execution, at int64) (*forkPlan, error) {
	rd := k.store.Read()
	p := &forkPlan{id: newID(), source: source, at: at, generations: map[string]int64{}, covered: map[string]bool{},
		restoreAt: map[string]*store.Checkpoint{}, ids: map[string]string{}}

	ip, err := k.planInPlace(ctx, rd, source, at)
	if err != nil {
		return nil, err
	}
	// A source that is itself an in-place fork is read through its view.
	sv, err := k.viewOf(ctx, rd, source)
	if err != nil {
		return nil, err
	}
	p.inPlace = ip
	copied := map[string]bool{}
	for after := int64(0); ip == nil; {
		page, err := k.finishedStepHeads(ctx, rd, sv, source.ID, at, after, wire.StepsPageSize)
		if err != nil {
			return nil, fmt.Errorf("read steps: %w", err)
		}
		for _, s := range page {
			after = s.Order
			if s.Status == wire.StepDenied && cleanupReasons[s.ErrorReason] {
				continue
			}
			p.steps = append(p.steps, s)
			copied[s.StepID] = true
			p.ids[s.StepID] = identity.StepID(p.id, s.Kind, s.Target, s.ArgsHash, s.Occurrence)
		}
		if len(page) < wire.StepsPageSize {
			break
		}
	}

	resources, err := rd.Resources(ctx, source.ID)
	if err != nil {
		return nil, fmt.Errorf("read resources: %w", err)
	}
	copiedKey := map[string]bool{}
	for _, r := range resources {
		if r.RegisteredSeq <= at {
			p.resources = append(p.resources, r)
			copiedKey[r.Key] = true
		}
	}

	// One pass over the log up to the point: the kept events, and the
	// generation of each key there. An in-place fork has the generations
	// from the mark after the point, and keeps no event of its own.
	if ip != nil {
		for key := range copiedKey {
			p.generations[key] = generationOf(ip.mark.Generations, key)
		}
	}
	for after := int64(0); ip == nil && after < at; {
		evs, err := k.readEvents(ctx, rd, sv, source.ID, after, wire.MaxEventsLimit)
		if err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		if len(evs) == 0 {
			break
		}
		for _, ev := range evs {
			if ev.Seq > at {
				break
			}
			after = ev.Seq
			keep, err := p.observe(ev, copied, copiedKey)
			if err != nil {
				return nil, err
			}
			if keep {
				ev.Payload = rewriteStepID(ev.Payload, p.ids)
				p.kept = append(p.kept, ev)
			}
		}
		if len(evs) < wire.MaxEventsLimit {
			break
		}
	}

	for _, r := range p.resources {
		pc, c, err := k.pointCoverage(ctx, rd, sv, r, at)
		if err != nil {
			return nil, err
		}
		p.covered[r.Key] = pc.Covered
		if c != nil {
			p.restoreAt[r.Key] = c
		}
	}
	if ip == nil {
		rows, err := k.checkpointRows(ctx, rd, sv, source.ID)
		if err != nil {
			return nil, fmt.Errorf("read checkpoints: %w", err)
		}
		for _, row := range rows {
			if copiedKey[row.Key] && row.CoveredSeq <= at {
				p.checkpoints = append(p.checkpoints, row)
			}
		}
		return p, nil
	}
	// In place: most copied checkpoints are read from the source in place
	// too; the rest are written, their seqs mapped now, so that writing
	// reads nothing. A resource's seq is mapped through the mark of the run
	// holding it; a checkpoint's by arithmetic on the kept counts its row
	// keeps, unless the row was written before rows kept them (0).
	spans := make([]carriedSpan, len(p.resources))
	for i, r := range p.resources {
		span, own, err := ip.planCarried(ctx, rd, source.ID, r.Key, at, p.restoreAt[r.Key])
		if err != nil {
			return nil, err
		}
		spans[i] = span
		p.checkpoints = append(p.checkpoints, own...)
	}
	for _, r := range p.resources {
		if _, err := ip.mapSeq(ctx, rd, source.ID, r.RegisteredSeq, 0); err != nil {
			return nil, err
		}
	}
	for _, c := range p.checkpoints {
		if _, err := ip.mapSeq(ctx, rd, source.ID, c.CoveredSeq, c.CoveredKept); err != nil {
			return nil, err
		}
		if c.InvalidatedSeq != 0 && c.InvalidatedSeq <= at {
			if _, err := ip.mapSeq(ctx, rd, source.ID, c.InvalidatedSeq, c.InvalidatedKept); err != nil {
				return nil, err
			}
		}
	}
	p.written = carryRows(p.id, p.resources, p.checkpoints, at, func(x, _ int64) int64 { return ip.mapped[x] })
	// The log's layout after the kept events: one resource.initialized a
	// resource, then per key the events of the rows read in place, then
	// those of the rows written.
	pos, i := 2+ip.kept+int64(len(p.resources)), 0
	for j, r := range p.resources {
		if spans[j].Rows > 0 {
			spans[j].At = pos + 1
			pos += spans[j].Rows
			ip.excluded.Carried = append(ip.excluded.Carried, spans[j])
		}
		for ; i < len(p.written) && p.written[i].Key == r.Key; i++ {
			pos++
		}
	}
	return p, nil
}

// carryRows maps the copied checkpoint rows to the fork's numbering
// (docs/protocol/forks.md §2) by mapSeq, from a seq and the row's kept count at it: by key in
// registration order, then covered_seq; when two rows of a key map to one
// position the later one is kept. Their kept counts are left for the writer.
func carryRows(forkID string, resources []*store.Resource, rows []*store.Checkpoint, at int64, mapSeq func(seq, kept int64) int64) []*store.Checkpoint {
	position := map[string]int{}
	for i, r := range resources {
		position[r.Key] = i
	}
	rows = slices.Clone(rows)
	sort.SliceStable(rows, func(i, j int) bool {
		if position[rows[i].Key] != position[rows[j].Key] {
			return position[rows[i].Key] < position[rows[j].Key]
		}
		return rows[i].CoveredSeq < rows[j].CoveredSeq
	})
	var out []*store.Checkpoint
	for _, row := range rows {
		m := &store.Checkpoint{ExecutionID: forkID, Key: row.Key, CoveredSeq: mapSeq(row.CoveredSeq, row.CoveredKept),
			Generation: row.Generation, CheckpointRef: row.CheckpointRef}
		if row.InvalidatedSeq != 0 && row.InvalidatedSeq <= at {
			m.InvalidatedSeq = mapSeq(row.InvalidatedSeq, row.InvalidatedKept)
		}
		if n := len(out); n > 0 && out[n-1].Key == m.Key && out[n-1].CoveredSeq == m.CoveredSeq {
			out[n-1] = m
			continue
		}
		out = append(out, m)
	}
	return out
}

// observe records what one source event at or before the fork point tells
// the plan, and reports whether the fork's log keeps it. The payloads were
// written by the kernel, so the few members needed are read in place rather
// than parsed: a fork reads tens of thousands of them.
func (p *forkPlan) observe(ev *store.Event, copiedStep, copiedKey map[string]bool) (bool, error) {
	isStep := strings.HasPrefix(ev.Type, "step.")
	if !isStep && ev.Type != EventResourceRegistered && ev.Type != EventResourceInitialized {
		return false, nil
	}
	sets, err := generationsSet(ev.Type, ev.Payload)
	if err != nil {
		return false, fmt.Errorf("event %d: generations: %w", ev.Seq, err)
	}
	for _, m := range sets {
		if n, ok := intValue(m.Value.Raw); ok {
			p.generations[m.Key] = n
		}
	}
	if isStep {
		return ev.Type != wire.EventStepRateLimited && copiedStep[string(textField(ev.Payload, "step_id"))], nil
	}
	return copiedKey[string(textField(ev.Payload, "key"))], nil
}

// textField is the text of a top-level string member of a kernel-written
// payload, or nil when it is absent, not a string or written with escapes
// (no key or id the kernel writes needs one).
func textField(payload []byte, key string) []byte {
	raw := jsonx.Field(payload, key)
	if len(raw) < 2 || raw[0] != '"' || bytes.IndexByte(raw, '\\') >= 0 {
		return nil
	}
	return raw[1 : len(raw)-1]
}

func intValue(raw []byte) (int64, bool) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// writeFork writes the fork's execution, copies and log in the current
// transaction (docs/protocol/forks.md §3) and enqueues its first dispatch.
func (o *op) writeFork(p *forkPlan) (*store.Execution, error) {
	src := p.source
	e := &store.Execution{
		ID: p.id, AgentID: src.AgentID, AgentVersion: src.AgentVersion, Input: src.Input, Status: wire.ExecPending,
		CreatedAt: o.now, UpdatedAt: o.now, ParentID: src.ParentID, OnBehalfOf: src.OnBehalfOf,
		ForkedFrom: src.ID, ForkSeq: p.at, ResourceKeys: []string{}, Writing: []string{}, IdempotencyKey: p.idemKey,
		Mark: &store.Mark{},
	}
	if ip := p.inPlace; ip != nil {
		// Unmarked: its own events after the source's would not count what
		// a fork of it needs, so its forks copy (reading it through forkView).
		e.Mark = nil
		e.ForkInPlace, e.ForkKept, e.ForkSteps, e.ForkExcluded = true, ip.kept, ip.steps, ip.excluded.encode()
	}
	if o.k.cfg.DeadlineTimeout > 0 {
		e.DeadlineAt = o.now.Add(o.k.cfg.DeadlineTimeout)
	}
	for _, r := range p.resources {
		e.ResourceKeys = append(e.ResourceKeys, r.Key)
	}
	restoration := &jsonx.Object{}
	for _, r := range p.resources {
		entry := (&jsonx.Object{}).Bool("covered", p.covered[r.Key])
		if c := p.restoreAt[r.Key]; c != nil {
			entry.String("checkpoint_ref", c.CheckpointRef).Int("checkpoint_seq", c.CoveredSeq)
		}
		restoration.Raw(r.Key, entry.Bytes())
	}
	e.Restoration = restoration.Bytes()
	if err := o.tx.InsertExecution(o.ctx, e); err != nil {
		return nil, fmt.Errorf("insert fork: %w", err)
	}
	o.e = e

	created := (&jsonx.Object{}).String("execution_id", e.ID).String("status", wire.ExecPending).String("agent_id", e.AgentID)
	if e.AgentVersion != "" {
		created.String("agent_version", e.AgentVersion)
	}
	if !e.DeadlineAt.IsZero() {
		created.String("deadline_at", wire.FormatTime(e.DeadlineAt))
	}
	o.emit(wire.EventExecutionCreated, created)
	o.emit(wire.EventExecutionForked, (&jsonx.Object{}).String("source_execution_id", src.ID).Int("fork_seq", p.at).
		Raw("restoration", e.Restoration))

	if p.inPlace != nil {
		return o.writeForkRest(p, e, func(x int64) int64 { return p.inPlace.mapped[x] })
	}
	// The kept events become the fork's, renumbered (their payloads carry
	// the copies' step ids already); copies keep their source's occurred_at
	// and are not counted against the fork's limits. The plan itself is not
	// changed: the transaction may run this again.
	sourceSeqs := make([]int64, len(p.kept))
	copies := make([]store.Event, len(p.kept))
	firstSeq := e.LastSeq + 1
	for i, ev := range p.kept {
		sourceSeqs[i] = ev.Seq
		e.LastSeq++
		copies[i] = store.Event{ExecutionID: e.ID, Seq: e.LastSeq, Type: ev.Type, Payload: ev.Payload, OccurredAt: ev.OccurredAt}
		o.append(&copies[i])
	}
	mapSeq := func(x int64) int64 {
		i := sort.Search(len(sourceSeqs), func(i int) bool { return sourceSeqs[i] > x })
		return firstSeq - 1 + int64(i) // the i-th kept event, or execution.forked when none
	}

	copiesOfSteps := make([]*store.Step, 0, len(p.steps))
	for _, s := range p.steps {
		c := *s
		c.ExecutionID = e.ID
		c.StepID = p.ids[s.StepID]
		if s.BodyStepID == "" {
			c.BodyExecutionID, c.BodyStepID = s.ExecutionID, s.StepID
		}
		e.StepOrder++
		c.Order = e.StepOrder
		c.TerminalSeq = mapSeq(s.TerminalSeq)
		if s.SubmittedSeq > 0 {
			c.SubmittedSeq = mapSeq(s.SubmittedSeq) // its first event is kept, so this is that event's seq
		}
		c.DispatchID, c.Attempt, c.StartInfo = "", 0, nil
		copiesOfSteps = append(copiesOfSteps, &c)
	}
	if err := o.tx.InsertSteps(o.ctx, copiesOfSteps); err != nil {
		return nil, fmt.Errorf("copy steps: %w", err)
	}
	return o.writeForkRest(p, e, mapSeq)
}

// writeForkRest writes what every fork copies after its kept history: the
// resources and checkpoints with their seqs mapped, then starts it. For an
// in-place fork the kept history is the source's positions 3…K+2, which it
// skips.
func (o *op) writeForkRest(p *forkPlan, e *store.Execution, mapSeq func(int64) int64) (*store.Execution, error) {
	if ip := p.inPlace; ip != nil {
		e.LastSeq += ip.kept
		e.StepOrder = ip.steps
	}
	for i, r := range p.resources {
		// A covered key goes on at the generation of the checkpoint that
		// covers it, an uncovered one at one past both its generation and
		// the newest copied checkpoint's (docs/protocol/forks.md §2). In a
		// log without gaps that is the key's generation at the point (plus
		// one); a fork's own log leaves out a step still running at its
		// fork point, whose start may have raised the generation.
		gen := p.generations[r.Key]
		if c := p.restoreAt[r.Key]; c != nil {
			if p.covered[r.Key] {
				gen = c.Generation
			} else {
				gen = max(gen, c.Generation)
			}
		}
		if !p.covered[r.Key] {
			gen++
		}
		ref := ""
		if c := p.restoreAt[r.Key]; c != nil {
			ref = c.CheckpointRef
		}
		cp := &store.Resource{ExecutionID: e.ID, Key: r.Key, Position: int64(i), DriverID: r.DriverID,
			Configuration: r.Configuration, CoverageReuse: r.CoverageReuse, EverySteps: r.EverySteps,
			OnCompletion: r.OnCompletion, RegisteredSeq: mapSeq(r.RegisteredSeq), Generation: gen, CheckpointRef: ref}
		if err := o.tx.InsertResource(o.ctx, cp); err != nil {
			return nil, fmt.Errorf("copy resource: %w", err)
		}
		init := (&jsonx.Object{}).String("key", r.Key).Int("generation", gen)
		if ref != "" {
			init.String("checkpoint_ref", ref)
		}
		o.emit(EventResourceInitialized, init)
	}

	// Copied checkpoints, per key in registration order: first those read
	// in place, whose positions are only counted, then those written. The
	// kept counts are the fork's own: known for a fork that copies (its log
	// up to them is appended in this operation), 0 for one that reads in
	// place, which keeps no marks.
	written, spans := p.written, map[string]carriedSpan{}
	if ip := p.inPlace; ip != nil {
		for _, s := range ip.excluded.Carried {
			spans[s.Key] = s
		}
	} else {
		written = carryRows(p.id, p.resources, p.checkpoints, p.at, func(x, _ int64) int64 { return mapSeq(x) })
	}
	i := 0
	for _, r := range p.resources {
		if s, ok := spans[r.Key]; ok {
			if e.LastSeq+1 != s.At {
				return nil, fmt.Errorf("fork %s: the checkpoints of %q read in place begin at %d, planned at %d", e.ID, r.Key, e.LastSeq+1, s.At)
			}
			e.LastSeq += s.Rows
		}
		for ; i < len(written) && written[i].Key == r.Key; i++ {
			m := *written[i] // the plan is not changed: the transaction may run this again
			m.CoveredKept = o.keptAfter(m.CoveredSeq)
			if m.InvalidatedSeq != 0 {
				m.InvalidatedKept = o.keptAfter(m.InvalidatedSeq)
			}
			if err := o.tx.InsertCheckpoint(o.ctx, &m); err != nil {
				return nil, fmt.Errorf("copy checkpoint: %w", err)
			}
			o.emit(EventResourceCheckpointed, checkpointedPayload(&m))
		}
	}

	started := (&jsonx.Object{}).String("execution_id", e.ID).String("status", wire.ExecRunning)
	if !e.DeadlineAt.IsZero() {
		started.String("deadline_at", wire.FormatTime(e.DeadlineAt))
	}
	o.emit(wire.EventExecutionStarted, started)
	e.Status = wire.ExecRunning
	if err := o.enqueueDispatch(); err != nil {
		return nil, err
	}
	// Only the fork's own events count against its limits: the copies were
	// counted in the source (docs/protocol/operations.md §2.4), and emit counted nothing else.
	return e, nil
}

// rewriteStepID replaces a payload's step_id by the copy's id; every other
// byte is kept. Step ids are all of one length, so the id is overwritten in
// place: the payload was read for this fork alone.
func rewriteStepID(payload []byte, ids map[string]string) []byte {
	start, end := jsonx.FieldSpan(payload, "step_id")
	if start < 0 || end-start < 2 || payload[start] != '"' {
		return payload
	}
	to, ok := ids[string(payload[start+1:end-1])]
	if !ok {
		return payload
	}
	if len(to) == end-start-2 {
		copy(payload[start+1:], to)
		return payload
	}
	out := make([]byte, 0, len(payload)-(end-start)+len(to)+2)
	out = append(out, payload[:start]...)
	out = jsonx.AppendString(out, to)
	return append(out, payload[end:]...)
}

// ListForks pages the direct forks of an execution, newest first (docs/protocol/forks.md §3).
func (k *Kernel) ListForks(ctx context.Context, c Caller, id string, f store.ExecutionFilter) (*ListResult, error) {
	if _, err := k.GetExecution(ctx, c, id); err != nil {
		return nil, err
	}
	f.AgentID, f.Status, f.ForkedFrom = "", "", id
	return k.ListExecutions(ctx, f)
}
