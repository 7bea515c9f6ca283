package kernel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/rebuno/rebuno/internal/store"
)

// Coverage reasons of the point answer (docs/protocol/resources.md §5.3).
const (
	CoverageCovered      = "covered"
	CoverageNoCheckpoint = "no_checkpoint"
	CoverageStepStarted  = "step_started"
)

// PointCoverage is coverage of one resource at one seq.
type PointCoverage struct {
	Key           string
	Covered       bool
	Reason        string
	CheckpointRef string // empty with no checkpoint
	CheckpointSeq int64  // 0 with no checkpoint
}

// CoveragePoint answers whether a fork at AtSeq would be covered.
type CoveragePoint struct {
	ExecutionID string
	AtSeq       int64
	Covered     bool
	Resources   []PointCoverage
}

// Range is an inclusive range of seqs.
type Range [2]int64

// ResourceRanges is one resource's covered ranges.
type ResourceRanges struct {
	Key           string
	RegisteredSeq int64
	Ranges        []Range
}

// CoverageRanges is coverage over a whole log.
type CoverageRanges struct {
	ExecutionID  string
	LastEventSeq int64
	Ranges       []Range
	Resources    []ResourceRanges
}

func atSeqError(last int64) error {
	return validation("at_seq", "at_seq must be between 1 and %d", last)
}

// pointCoverage applies docs/protocol/resources.md §5.1 to one resource: the newest checkpoint at or
// before seq covers it unless a coverage-ending start came after it.
// It also returns that checkpoint: the one a fork at seq restores (nil when
// there is none).
func (k *Kernel) pointCoverage(ctx context.Context, rd store.Reader, v *forkView, r *store.Resource, seq int64) (PointCoverage, *store.Checkpoint, error) {
	pc := PointCoverage{Key: r.Key, Reason: CoverageNoCheckpoint}
	c, err := k.checkpointAt(ctx, rd, v, r.ExecutionID, r.Key, seq)
	if errors.Is(err, store.ErrNotFound) {
		return pc, nil, nil
	}
	if err != nil {
		return pc, nil, fmt.Errorf("read checkpoint: %w", err)
	}
	pc.CheckpointRef, pc.CheckpointSeq = c.CheckpointRef, c.CoveredSeq
	pc.Covered = c.InvalidatedSeq == 0 || c.InvalidatedSeq > seq
	pc.Reason = CoverageStepStarted
	if pc.Covered {
		pc.Reason = CoverageCovered
	}
	return pc, c, nil
}

// CoverageAt answers the point query for one seq of an execution's log.
func (k *Kernel) CoverageAt(ctx context.Context, c Caller, id string, seq int64) (*CoveragePoint, error) {
	e, err := k.GetExecution(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if seq < 1 || seq > e.LastSeq {
		return nil, atSeqError(e.LastSeq)
	}
	rd := k.store.Read()
	v, err := k.viewOf(ctx, rd, e)
	if err != nil {
		return nil, err
	}
	resources, err := rd.Resources(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("read resources: %w", err)
	}
	out := &CoveragePoint{ExecutionID: id, AtSeq: seq, Covered: true, Resources: []PointCoverage{}}
	for _, r := range resources {
		if r.RegisteredSeq > seq {
			continue
		}
		pc, _, err := k.pointCoverage(ctx, rd, v, r, seq)
		if err != nil {
			return nil, err
		}
		out.Covered = out.Covered && pc.Covered
		out.Resources = append(out.Resources, pc)
	}
	return out, nil
}

// CoverageRangesOf answers coverage over the whole log in one pass over the
// registrations and checkpoint rows (docs/protocol/resources.md §5.2).
func (k *Kernel) CoverageRangesOf(ctx context.Context, c Caller, id string) (*CoverageRanges, error) {
	e, err := k.GetExecution(ctx, c, id)
	if err != nil {
		return nil, err
	}
	rd := k.store.Read()
	v, err := k.viewOf(ctx, rd, e)
	if err != nil {
		return nil, err
	}
	resources, err := rd.Resources(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("read resources: %w", err)
	}
	rows, err := k.checkpointRows(ctx, rd, v, id)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	last := e.LastSeq
	byKey := map[string][]*store.Checkpoint{}
	for _, row := range rows {
		byKey[row.Key] = append(byKey[row.Key], row)
	}
	out := &CoverageRanges{ExecutionID: id, LastEventSeq: last, Resources: []ResourceRanges{}}
	// A point is covered when every key registered at it is: start from
	// the whole log and remove each key's uncovered stretches.
	overall := []Range{}
	if last >= 1 {
		overall = []Range{{1, last}}
	}
	for _, r := range resources {
		var covered []Range
		for _, row := range byKey[r.Key] {
			end := last
			if row.InvalidatedSeq != 0 {
				end = row.InvalidatedSeq - 1
			}
			covered = append(covered, Range{row.CoveredSeq, min(end, last)})
		}
		covered = mergeRanges(covered)
		out.Resources = append(out.Resources, ResourceRanges{Key: r.Key, RegisteredSeq: r.RegisteredSeq, Ranges: covered})
		if r.RegisteredSeq <= last {
			uncovered := subtractRanges([]Range{{r.RegisteredSeq, last}}, covered)
			overall = subtractRanges(overall, uncovered)
		}
	}
	out.Ranges = overall
	return out, nil
}

// mergeRanges sorts ranges and joins the ones that overlap or touch; empty
// ranges are dropped.
func mergeRanges(in []Range) []Range {
	out := []Range{}
	for _, r := range sortRanges(in) {
		if r[0] > r[1] {
			continue
		}
		if n := len(out); n > 0 && r[0] <= out[n-1][1]+1 {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

func sortRanges(in []Range) []Range {
	out := append([]Range{}, in...)
	slices.SortFunc(out, func(a, b Range) int { return cmp.Compare(a[0], b[0]) })
	return out
}

// subtractRanges removes every point of b from a; both are merged lists.
func subtractRanges(a, b []Range) []Range {
	out := []Range{}
	for _, r := range a {
		pieces := []Range{r}
		for _, cut := range b {
			var next []Range
			for _, p := range pieces {
				if cut[1] < p[0] || cut[0] > p[1] {
					next = append(next, p)
					continue
				}
				if cut[0] > p[0] {
					next = append(next, Range{p[0], cut[0] - 1})
				}
				if cut[1] < p[1] {
					next = append(next, Range{cut[1] + 1, p[1]})
				}
			}
			pieces = next
		}
		out = append(out, pieces...)
	}
	return mergeRanges(out)
}
