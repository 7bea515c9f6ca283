package kernel

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// A fork that reads its source in place (docs/architecture.md, "Forks")
// stores none of the source's history: its log's positions 3…K+2 and its
// steps' orders 1…N are the source's kept events and copied steps, read
// through forkView. What it must record is what of the source up to the
// fork point it leaves out, found from the marks without a pass over the
// history.

// exclusions is what an in-place fork leaves out of its source up to the
// fork point: the events of the steps it does not copy (source seq and the
// keepable events before each, ascending) and those steps' orders
// (ascending); and the checkpoint rows it reads from its source in place.
// It is stored as the fork's ForkExcluded.
type exclusions struct {
	Seqs    []int64       `json:"seqs"`
	Kept    []int64       `json:"kept"`
	Orders  []int64       `json:"orders"`
	Carried []carriedSpan `json:"carried,omitempty"`
}

// carriedSpan is the part of one key's checkpoint rows that an in-place
// fork reads from its source in place, as it reads the kept events: the
// source's rows of Key with covered_seq ≤ UpTo, all closed by the fork
// point and before any excluded event, so that each maps by arithmetic on
// its kept counts. Rows of one kept count map to one position and show as
// the last of them (docs/protocol/forks.md §2), so the fork shows Rows rows, whose
// resource.checkpointed events are its positions At…At+Rows−1. The key's
// other copied rows (open at the fork point, or after an excluded event)
// are the fork's own, written after these.
type carriedSpan struct {
	Key  string `json:"key"`
	UpTo int64  `json:"up_to"`
	Rows int64  `json:"rows"`
	At   int64  `json:"at"`
}

func (x *exclusions) encode() []byte {
	b, _ := json.Marshal(x)
	return b
}

func decodeExclusions(b []byte) (*exclusions, error) {
	x := &exclusions{}
	if len(b) == 0 {
		return x, nil
	}
	if err := json.Unmarshal(b, x); err != nil {
		return nil, fmt.Errorf("fork exclusions: %w", err)
	}
	return x, nil
}

// inPlacePlan is what planning found for an in-place fork at `at`.
type inPlacePlan struct {
	kept, steps int64 // K and N
	excluded    *exclusions
	mark        *store.Mark     // the source's mark after `at`
	mapped      map[int64]int64 // source seq → fork seq, for the seqs the fork's copies carry
	runReads    int             // runs mapSeq read (a test counts them)
}

// planInPlace finds what an in-place fork of source at `at` keeps, or nil
// when the source cannot be read in place: it predates marks, or is itself
// an in-place fork (whose forks copy, reading it through forkView).
func (k *Kernel) planInPlace(ctx context.Context, rd store.Reader, source *store.Execution, at int64) (*inPlacePlan, error) {
	if source.Mark == nil || source.ForkInPlace {
		return nil, nil
	}
	m, ok, err := markAfter(ctx, rd, source.ID, at)
	if err != nil || !ok {
		return nil, err
	}
	// O: the last step submitted at or before `at`. Orders grow with the
	// seq of each step's first event, so a binary search finds it.
	lo, hi := int64(0), source.StepOrder
	for lo < hi {
		mid := (lo + hi + 1) / 2
		s, err := rd.StepByOrder(ctx, source.ID, mid)
		if err != nil {
			return nil, fmt.Errorf("read step %d: %w", mid, err)
		}
		if s.SubmittedSeq == 0 {
			return nil, nil // recorded before submitted seqs were kept
		}
		if s.SubmittedSeq <= at {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	last := lo
	// Every step closed copyably by `at` has an order of at most `last`, so
	// exactly last − closed of orders 1…last are not copied: open at `at`,
	// or cancelled or denied by the terminal clean-up. They are found from
	// `last` down, usually at once.
	want := last - m.Closed
	if want < 0 {
		k.log.Warn("fork: marks disagree with the steps; copying instead", "execution_id", source.ID, "at", at)
		return nil, nil
	}
	x := &exclusions{}
	var ids []string
	from := int64(0)
	for order := last; int64(len(x.Orders)) < want && order >= 1; order-- {
		s, err := rd.StepByOrder(ctx, source.ID, order)
		if err != nil {
			return nil, fmt.Errorf("read step %d: %w", order, err)
		}
		if copiedAt(s, at) {
			continue
		}
		x.Orders = append(x.Orders, order)
		ids = append(ids, s.StepID)
		if from == 0 || s.SubmittedSeq < from {
			from = s.SubmittedSeq
		}
	}
	if int64(len(x.Orders)) < want {
		k.log.Warn("fork: marks disagree with the steps; copying instead", "execution_id", source.ID, "at", at)
		return nil, nil
	}
	slices.Sort(x.Orders)
	if len(ids) > 0 {
		ok, err := collectExcluded(ctx, rd, source.ID, from, at, ids, x)
		if err != nil || !ok {
			return nil, err
		}
	}
	return &inPlacePlan{kept: m.Kept - int64(len(x.Seqs)), steps: m.Closed, excluded: x, mark: m, mapped: map[int64]int64{}}, nil
}

// copiedAt reports whether a fork at `at` copies s (docs/protocol/forks.md §2).
func copiedAt(s *store.Step, at int64) bool {
	switch s.Status {
	case wire.StepSucceeded, wire.StepFailed:
	case wire.StepDenied:
		if cleanupReasons[s.ErrorReason] {
			return false
		}
	default:
		return false
	}
	return s.TerminalSeq >= 1 && s.TerminalSeq <= at
}

// collectExcluded walks the source's log from `from` to `at`, run by run,
// and records in x the keepable events of the steps in ids, with the
// keepable events before each. False when a run carries no mark.
func collectExcluded(ctx context.Context, rd store.Reader, sourceID string, from, at int64, ids []string, x *exclusions) (bool, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for seq := from; seq <= at; {
		run, err := rd.EventRun(ctx, sourceID, seq)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read events: %w", err)
		}
		if run.Mark == nil {
			return false, nil
		}
		m := run.Mark
		for _, ev := range run.Events {
			if ev.Seq > at {
				break
			}
			if ev.Seq >= from && keepable(ev.Type) && want[string(textField(ev.Payload, "step_id"))] {
				x.Seqs = append(x.Seqs, ev.Seq)
				x.Kept = append(x.Kept, m.Kept)
			}
			if m, err = advanceMark(m, ev.Type, ev.Payload); err != nil {
				return false, err
			}
		}
		seq = run.LastSeq + 1
	}
	return true, nil
}

// markAfter is the source's mark after its event at seq; false when the
// run holding seq has no mark (or seq is not in a run).
func markAfter(ctx context.Context, rd store.Reader, id string, seq int64) (*store.Mark, bool, error) {
	run, err := rd.EventRun(ctx, id, seq)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read events: %w", err)
	}
	if run.Mark == nil {
		return nil, false, nil
	}
	m, err := markThrough(run, seq)
	return m, err == nil, err
}

// mapSeq maps a source seq x ≤ at to the fork's numbering: the fork seq of
// the last kept event at or before x, or 2 when none is
// (docs/protocol/forks.md §3), from the source's kept count after x. kept is
// that count when the caller knows it (a checkpoint row keeps it), else 0,
// and the mark after x is read from the run holding it.
func (p *inPlacePlan) mapSeq(ctx context.Context, rd store.Reader, sourceID string, x, kept int64) (int64, error) {
	if x < 1 {
		return 0, nil
	}
	if y, ok := p.mapped[x]; ok {
		return y, nil
	}
	if kept == 0 {
		m, ok, err := markAfter(ctx, rd, sourceID, x)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("no mark at seq %d of %s", x, sourceID)
		}
		p.runReads++
		kept = m.Kept
	}
	y := forkSeqKept(kept, p.excluded, x)
	p.mapped[x] = y
	return y, nil
}

// forkSeq is the fork's seq of source seq x, from the source's mark after x.
func forkSeq(after *store.Mark, x *exclusions, seq int64) int64 {
	return forkSeqKept(after.Kept, x, seq)
}

// forkSeqKept is the fork's seq of source seq x, from the source's count of
// keepable events up to x: position 2 plus those the fork keeps
// (docs/protocol/forks.md §3).
func forkSeqKept(kept int64, x *exclusions, seq int64) int64 {
	return 2 + kept - int64(sort.Search(len(x.Seqs), func(i int) bool { return x.Seqs[i] > seq }))
}

// planCarried splits the checkpoint rows of key that an in-place fork at
// `at` copies: those it reads in place (a span; Rows 0 when none) and
// those it writes as its own, by covered_seq. It reads a few rows and
// counts the rest, so its cost does not grow with the source's checkpoints.
// newest is the key's newest row at or before `at` (the one the fork
// restores), nil when there is none.
func (p *inPlacePlan) planCarried(ctx context.Context, rd store.Reader, sourceID, key string, at int64, newest *store.Checkpoint) (carriedSpan, []*store.Checkpoint, error) {
	span := carriedSpan{Key: key}
	// Every coverage-ending start closes all open rows at once, so the rows
	// still open at `at` are the newest ones: walk back to the oldest.
	upTo := at
	c, err := newest, error(nil)
	for err == nil && c != nil && (c.InvalidatedSeq == 0 || c.InvalidatedSeq > at) {
		upTo = c.CoveredSeq - 1
		c, err = checkpointAtOrNil(ctx, rd, sourceID, key, c.CoveredSeq-1)
	}
	if err != nil {
		return span, nil, err
	}
	if len(p.excluded.Seqs) > 0 {
		upTo = min(upTo, p.excluded.Seqs[0]-1)
	}
	n, err := rd.CountCheckpoints(ctx, sourceID, key, upTo)
	if err != nil {
		return span, nil, fmt.Errorf("count checkpoints: %w", err)
	}
	if n.Unmarked > 0 || n.Rows == 0 {
		upTo = 0 // rows without kept counts are mapped through the log, as copies
	}
	own, err := rd.CheckpointRange(ctx, sourceID, key, upTo, at)
	if err != nil {
		return span, nil, fmt.Errorf("read checkpoints: %w", err)
	}
	if upTo == 0 {
		return span, own, nil
	}
	span.UpTo, span.Rows = upTo, n.KeptCounts
	if len(own) == 0 {
		return span, own, nil
	}
	// The newest rows read in place map where the first own row does when
	// no kept event lies between them: the own row is then the one shown.
	first, err := p.mapSeq(ctx, rd, sourceID, own[0].CoveredSeq, own[0].CoveredKept)
	if err != nil {
		return span, nil, err
	}
	last, err := checkpointAtOrNil(ctx, rd, sourceID, key, upTo)
	if err != nil || last == nil {
		return span, nil, cmp.Or(err, fmt.Errorf("checkpoint of %s at %d of %s is gone", key, upTo, sourceID))
	}
	if forkSeqKept(last.CoveredKept, p.excluded, last.CoveredSeq) < first {
		return span, own, nil
	}
	for g := last.CoveredKept; last != nil && last.CoveredKept == g; {
		span.UpTo = last.CoveredSeq - 1
		if last, err = checkpointAtOrNil(ctx, rd, sourceID, key, span.UpTo); err != nil {
			return span, nil, err
		}
	}
	span.Rows--
	return span, own, nil
}

// checkpointAtOrNil is store.Reader.CheckpointAt with nil for none.
func checkpointAtOrNil(ctx context.Context, rd store.Reader, id, key string, seq int64) (*store.Checkpoint, error) {
	c, err := rd.CheckpointAt(ctx, id, key, seq)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	return c, nil
}
