package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Limits of docs/protocol/resources.md (docs/protocol/README.md §6).
const (
	MaxResources        = 32
	MaxDriverIDBytes    = 256
	MaxResourceJSON     = 64 * 1024
	MaxEverySteps       = 1_000_000
	MaxCheckpointRef    = 1024
	MaxCaptureFailure   = 4096
	MaxCapturesPerList  = 32
	refusalUnknown      = "unknown_resource"
	refusalMissingRef   = "missing_checkpoint_ref"
	refusalRefTooLong   = "checkpoint_ref_too_long"
	refusalDuplicate    = "duplicate_capture"
	refusalStale        = "stale_generation"
	refusalWritersAlive = "writers_active"
)

// Resource event types (docs/protocol/resources.md §6).
const (
	EventResourceRegistered       = "resource.registered"
	EventResourceBound            = "resource.bound"
	EventResourceCheckpointed     = "resource.checkpointed"
	EventResourceCheckpointFailed = "resource.checkpoint_failed"
	EventResourceInitialized      = "resource.initialized"
)

// Capture is one captures entry: a checkpoint ref taken in a generation.
type Capture struct {
	Key        string
	Generation int64
	// Ref is the driver's ref; anything but a JSON string arrives as "".
	Ref string
}

// CaptureFailure is one capture_failures entry.
type CaptureFailure struct {
	Key        string
	Generation int64
	Error      string
}

// Captures are the two capture lists a step outcome or a publish carries.
type Captures struct {
	Captures []Capture
	Failures []CaptureFailure
}

// ResourceView is the register answer (docs/protocol/resources.md §2).
type ResourceView struct {
	*store.Resource
	Covered bool
}

// RegisterRequest is a parsed register body.
type RegisterRequest struct {
	Key           string
	DriverID      string
	Configuration []byte // canonical JSON; nil when absent or null
	CoverageReuse bool
	EverySteps    int64
	OnCompletion  bool
}

// RegisterResource registers a resource key in an execution, or confirms an
// identical registration; the stored checkpoint policy always wins.
func (k *Kernel) RegisterResource(ctx context.Context, c Caller, id string, h DispatchHeaders, r RegisterRequest) (*ResourceView, error) {
	if h.ID == "" {
		return nil, MissingDispatchID()
	}
	switch {
	case !ValidResourceKey(r.Key):
		return nil, validation("key", "invalid resource key %q", r.Key)
	case r.DriverID == "" || len(r.DriverID) > MaxDriverIDBytes:
		return nil, validation("driver_id", "driver_id must be 1 to %d bytes", MaxDriverIDBytes)
	case r.EverySteps < 0 || r.EverySteps > MaxEverySteps:
		return nil, validation("every_steps", "every_steps must be 0 to %d", MaxEverySteps)
	case len(r.Configuration) > MaxResourceJSON:
		return nil, validation("configuration", "configuration is larger than %d bytes", MaxResourceJSON)
	}
	var view *ResourceView
	err := k.update(ctx, id, func(o *op) error {
		d, err := o.agentWrite(id, c, h)
		if err != nil {
			return err
		}
		o.enforce = true
		stored, err := o.tx.Resource(o.ctx, id, r.Key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			if len(o.e.ResourceKeys) >= MaxResources {
				return validation("key", "an execution has at most %d resources", MaxResources)
			}
			p := (&jsonx.Object{}).String("key", r.Key).String("driver_id", r.DriverID).Raw("configuration", r.Configuration).
				Bool("coverage_reuse", r.CoverageReuse).Int("every_steps", r.EverySteps).Bool("on_completion", r.OnCompletion)
			o.emit(EventResourceRegistered, p)
			stored = &store.Resource{ExecutionID: id, Key: r.Key, Position: int64(len(o.e.ResourceKeys)), DriverID: r.DriverID,
				Configuration: r.Configuration, CoverageReuse: r.CoverageReuse, EverySteps: r.EverySteps,
				OnCompletion: r.OnCompletion, RegisteredSeq: o.e.LastSeq}
			if err := o.tx.InsertResource(o.ctx, stored); err != nil {
				return fmt.Errorf("insert resource: %w", err)
			}
			o.e.ResourceKeys = append(append([]string{}, o.e.ResourceKeys...), r.Key)
			o.e.ByteCount += int64(len(r.Configuration))
		case err != nil:
			return fmt.Errorf("read resource: %w", err)
		case stored.DriverID != r.DriverID || !jsonEqual(stored.Configuration, r.Configuration) || stored.CoverageReuse != r.CoverageReuse:
			return &Error{Code: wire.CodeConflict,
				Message: fmt.Sprintf("conflict: resource %q is registered with another driver_id, configuration or coverage_reuse", r.Key),
				Details: map[string]any{
					"stored":    registrationJSON(stored.DriverID, stored.Configuration, stored.CoverageReuse),
					"requested": registrationJSON(r.DriverID, r.Configuration, r.CoverageReuse),
				}}
		}
		covered, err := o.covered(stored)
		if err != nil {
			return err
		}
		view = &ResourceView{Resource: stored, Covered: covered}
		return o.renew(d, h)
	})
	if errors.Is(err, errStorageLimit) {
		return nil, errTerminal()
	}
	return view, err
}

func registrationJSON(driverID string, configuration []byte, reuse bool) []byte {
	return (&jsonx.Object{}).String("driver_id", driverID).Raw("configuration", configuration).Bool("coverage_reuse", reuse).Bytes()
}

// jsonEqual compares two canonical JSON values; nil is null.
func jsonEqual(a, b []byte) bool {
	if len(a) == 0 {
		a = []byte("null")
	}
	if len(b) == 0 {
		b = []byte("null")
	}
	return string(a) == string(b)
}

// covered is coverage at the current end of the log: the resource has an
// open checkpoint. Every coverage-ending start closes all open rows at once,
// so the newest row is open exactly when one is.
func (o *op) covered(r *store.Resource) (bool, error) {
	return coveredNow(o.ctx, o.tx, r)
}

func coveredNow(ctx context.Context, rd store.Reader, r *store.Resource) (bool, error) {
	c, err := rd.CheckpointAt(ctx, r.ExecutionID, r.Key, math.MaxInt64)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read checkpoint: %w", err)
	}
	return c.InvalidatedSeq == 0, nil
}

// BindResource stores the binding that lets a driver find the live resource
// again; a retry with an equal binding is a no-op, a different one a
// conflict.
func (k *Kernel) BindResource(ctx context.Context, c Caller, id, key string, h DispatchHeaders, binding []byte) error {
	if h.ID == "" {
		return MissingDispatchID()
	}
	if len(binding) == 0 || string(binding) == "null" {
		return validation("binding", "binding is required and must not be null")
	}
	if len(binding) > MaxResourceJSON {
		return validation("binding", "binding is larger than %d bytes", MaxResourceJSON)
	}
	err := k.update(ctx, id, func(o *op) error {
		d, err := o.agentWrite(id, c, h)
		if err != nil {
			return err
		}
		o.enforce = true
		r, err := o.tx.Resource(o.ctx, id, key)
		if err != nil {
			return notFoundOr(err, "resource")
		}
		switch {
		case r.Binding == nil:
			r.Binding = binding
			if err := o.tx.UpdateResource(o.ctx, r); err != nil {
				return fmt.Errorf("bind resource: %w", err)
			}
			o.e.ByteCount += int64(len(binding))
			o.emit(EventResourceBound, (&jsonx.Object{}).String("key", key).Raw("binding", binding))
		case !jsonEqual(r.Binding, binding):
			return errConflict("resource already bound")
		}
		return o.renew(d, h)
	})
	if errors.Is(err, errStorageLimit) {
		return errTerminal()
	}
	return err
}

// PublishCheckpoints records captures reported outside a step outcome:
// baselines and completion captures (docs/protocol/resources.md §4).
func (k *Kernel) PublishCheckpoints(ctx context.Context, c Caller, id string, h DispatchHeaders, caps Captures) error {
	if h.ID == "" {
		return MissingDispatchID()
	}
	if err := validateCaptures(caps); err != nil {
		return err
	}
	err := k.update(ctx, id, func(o *op) error {
		d, err := o.agentWrite(id, c, h)
		if err != nil {
			return err
		}
		o.enforce = true
		if err := o.processCaptures(caps, nil); err != nil {
			return err
		}
		return o.renew(d, h)
	})
	if errors.Is(err, errStorageLimit) {
		return errTerminal()
	}
	return err
}

func validateCaptures(caps Captures) error {
	if len(caps.Captures) > MaxCapturesPerList {
		return validation("captures", "at most %d captures", MaxCapturesPerList)
	}
	if len(caps.Failures) > MaxCapturesPerList {
		return validation("capture_failures", "at most %d capture failures", MaxCapturesPerList)
	}
	return nil
}

// processCaptures applies the capture lists in the current transaction,
// after the step outcome when there is one (docs/protocol/resources.md §4). A refused capture is an
// event, never an error. recording is the step whose outcome this request
// records: it no longer counts as a writer.
func (o *op) processCaptures(caps Captures, recording *store.Step) error {
	if len(caps.Captures) == 0 && len(caps.Failures) == 0 {
		return nil
	}
	m := o.k.metrics
	for _, f := range caps.Failures {
		o.emit(EventResourceCheckpointFailed, (&jsonx.Object{}).String("key", f.Key).Int("generation", f.Generation).
			String("error", TruncateUTF8(f.Error, MaxCaptureFailure)))
		o.tx.AfterCommit(func() { m.CheckpointFailures.WithLabelValues("reported").Inc() })
	}
	if len(caps.Captures) == 0 {
		return nil
	}
	// Coverage starts at the first event this transaction appended: the
	// step's outcome, or the publish's own first event.
	firstSeq := o.e.LastSeq + 1
	if len(o.events) > 0 {
		firstSeq = o.events[0].Seq
	}
	resources, err := o.tx.Resources(o.ctx, o.e.ID)
	if err != nil {
		return fmt.Errorf("read resources: %w", err)
	}
	byKey := make(map[string]*store.Resource, len(resources))
	for _, r := range resources {
		byKey[r.Key] = r
	}
	var writers []*store.Step
	writersRead := false
	seen := map[string]bool{}
	for _, cp := range caps.Captures {
		r := byKey[cp.Key]
		refusal := ""
		switch {
		case r == nil:
			refusal = refusalUnknown
		case cp.Ref == "":
			refusal = refusalMissingRef
		case len(cp.Ref) > MaxCheckpointRef:
			refusal = refusalRefTooLong
		case seen[cp.Key]:
			refusal = refusalDuplicate
		case cp.Generation != r.Generation:
			refusal = refusalStale
		}
		seen[cp.Key] = true
		if refusal == "" {
			if !writersRead {
				if writers, err = o.writers(recording); err != nil {
					return err
				}
				writersRead = true
			}
			if writesTo(writers, r) {
				refusal = refusalWritersAlive
			}
		}
		if refusal != "" {
			o.emit(EventResourceCheckpointFailed, (&jsonx.Object{}).String("key", cp.Key).Int("generation", cp.Generation).
				String("error", refusal))
			o.tx.AfterCommit(func() { m.CheckpointFailures.WithLabelValues(refusal).Inc() })
			continue
		}
		o.e.ByteCount += int64(len(cp.Ref))
		row := &store.Checkpoint{ExecutionID: o.e.ID, Key: r.Key, CoveredSeq: firstSeq, Generation: cp.Generation, CheckpointRef: cp.Ref}
		o.emit(EventResourceCheckpointed, checkpointedPayload(row))
		// The event at firstSeq is appended by now: this one when it is
		// the operation's first.
		row.CoveredKept = o.keptAfter(firstSeq)
		if err := o.tx.InsertCheckpoint(o.ctx, row); err != nil {
			return fmt.Errorf("insert checkpoint: %w", err)
		}
		r.StartsSinceCheckpoint = 0
		if err := o.tx.UpdateResource(o.ctx, r); err != nil {
			return fmt.Errorf("reset resource counter: %w", err)
		}
		o.tx.AfterCommit(func() { m.Checkpoints.Inc() })
	}
	return nil
}

// checkpointedPayload is the resource.checkpointed event of a checkpoint
// row (docs/protocol/resources.md §6): invalidated_seq only when it is closed, as in a fork's copies.
func checkpointedPayload(c *store.Checkpoint) *jsonx.Object {
	p := (&jsonx.Object{}).String("key", c.Key).Int("generation", c.Generation).
		String("checkpoint_ref", c.CheckpointRef).Int("covered_seq", c.CoveredSeq)
	if c.InvalidatedSeq != 0 {
		p.Int("invalidated_seq", c.InvalidatedSeq)
	}
	return p
}

// writers are the tool and local steps executing under the execution's
// current attempt (docs/protocol/resources.md §3), except the step being recorded. An orphan of a
// reclaimed or superseded attempt is not one: it is fenced. (LLM calls never
// are: they change no resource.) The candidates are the steps the
// execution's row lists as started (startWriting); one that has ended since
// is skipped here, so only a start that failed to list its step could hide
// a writer.
func (o *op) writers(recording *store.Step) ([]*store.Step, error) {
	if o.e.DispatchID == "" || len(o.e.Writing) == 0 {
		return nil, nil
	}
	d, err := o.tx.Dispatch(o.ctx, o.e.DispatchID)
	if err != nil {
		return nil, notFoundOr(err, "dispatch")
	}
	var out []*store.Step
	for _, id := range o.e.Writing {
		if recording != nil && id == recording.StepID {
			continue
		}
		s, err := o.tx.Step(o.ctx, o.e.ID, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return nil, fmt.Errorf("read executing step: %w", err)
		}
		if s.Status != wire.StepExecuting || s.Kind == wire.KindLLMCall || s.DispatchID != d.ID || s.Attempt != d.Attempt {
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// startWriting lists a tool or local step that starts executing on its
// execution's row, where a capture looks for writers at work.
func (o *op) startWriting(s *store.Step) {
	if s.Kind == wire.KindLLMCall || contains(o.e.Writing, s.StepID) {
		return
	}
	o.e.Writing = append(slices.Clone(o.e.Writing), s.StepID)
}

// stopWriting takes a step that stopped executing off the list.
func (o *op) stopWriting(s *store.Step) {
	if i := slices.Index(o.e.Writing, s.StepID); i >= 0 {
		o.e.Writing = slices.Delete(slices.Clone(o.e.Writing), i, i+1)
	}
}

// writesTo reports whether one of the writers may change r: every writer
// does without coverage_reuse, a declaring one does with it.
func writesTo(writers []*store.Step, r *store.Resource) bool {
	for _, s := range writers {
		if !r.CoverageReuse || contains(s.Resources, r.Key) {
			return true
		}
	}
	return false
}

// startEntry is what a live start records of one raised generation.
type startEntry struct {
	Key        string `json:"key"`
	Generation int64  `json:"generation"`
}

// liveStart applies a live start of s to the execution's resources (docs/protocol/resources.md §3):
// coverage ends and the generation rises for every resource without
// coverage_reuse and for each one s declares; declared ones count the
// start. It returns the proceed entries and adds resources/generations to
// the step.executing payload p, which the caller appends next.
func (o *op) liveStart(s *store.Step, p *jsonx.Object) ([]ResourceEntry, error) {
	if len(o.e.ResourceKeys) == 0 {
		s.StartInfo = nil
		return []ResourceEntry{}, nil
	}
	resources, err := o.tx.Resources(o.ctx, o.e.ID)
	if err != nil {
		return nil, fmt.Errorf("read resources: %w", err)
	}
	seq := o.e.LastSeq + 1 // the step.executing the caller appends next
	// The kept count after it (store.Checkpoint): a step.executing is
	// keepable, and nothing is appended before it.
	kept := int64(0)
	if m := o.e.Mark; m != nil && keepable(wire.EventStepExecuting) {
		kept = m.Kept + 1
	}
	affecting := s.Kind != wire.KindLLMCall
	byKey := make(map[string]*store.Resource, len(resources))
	raised := map[string]bool{}
	gens := &jsonx.Object{}
	for _, r := range resources {
		byKey[r.Key] = r
		declared := affecting && contains(s.Resources, r.Key)
		if !r.CoverageReuse || declared {
			r.Generation++
			raised[r.Key] = true
			gens.Int(r.Key, r.Generation)
			if err := o.tx.InvalidateCheckpoints(o.ctx, o.e.ID, r.Key, seq, kept); err != nil {
				return nil, fmt.Errorf("close checkpoints: %w", err)
			}
		}
		if declared {
			r.StartsSinceCheckpoint++
		}
		if raised[r.Key] {
			if err := o.tx.UpdateResource(o.ctx, r); err != nil {
				return nil, fmt.Errorf("update resource: %w", err)
			}
		}
	}
	entries := []ResourceEntry{}
	info := []startEntry{}
	add := func(r *store.Resource, declared bool) {
		entries = append(entries, ResourceEntry{Key: r.Key, Generation: r.Generation, Due: declared && due(r)})
		info = append(info, startEntry{Key: r.Key, Generation: r.Generation})
	}
	if affecting {
		for _, key := range s.Resources {
			if r := byKey[key]; r != nil && raised[key] {
				add(r, true)
			}
		}
	}
	for _, r := range resources {
		if raised[r.Key] && !(affecting && contains(s.Resources, r.Key)) {
			add(r, false)
		}
	}
	if affecting && len(s.Resources) > 0 {
		p.Strings("resources", s.Resources)
	}
	if len(raised) > 0 {
		p.Raw("generations", gens.Bytes())
	}
	s.StartInfo, _ = json.Marshal(info)
	return entries, nil
}

func due(r *store.Resource) bool {
	return r.EverySteps > 0 && r.StartsSinceCheckpoint >= r.EverySteps
}

// restartEntries answers a same-attempt retry of a lost proceed: the entries
// of the step's latest start, with due read from the counters now (docs/protocol/resources.md §3).
func (o *op) restartEntries(s *store.Step) ([]ResourceEntry, error) {
	var info []startEntry
	if len(s.StartInfo) == 0 || json.Unmarshal(s.StartInfo, &info) != nil || len(info) == 0 {
		return []ResourceEntry{}, nil
	}
	entries := make([]ResourceEntry, 0, len(info))
	for _, in := range info {
		r, err := o.tx.Resource(o.ctx, o.e.ID, in.Key)
		if err != nil {
			return nil, notFoundOr(err, "resource")
		}
		declared := s.Kind != wire.KindLLMCall && contains(s.Resources, in.Key)
		entries = append(entries, ResourceEntry{Key: in.Key, Generation: in.Generation, Due: declared && due(r)})
	}
	return entries, nil
}
