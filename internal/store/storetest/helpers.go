package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

func update(t *testing.T, s store.Store, lock string, fn func(ctx context.Context, tx store.Tx) error) {
	t.Helper()
	if err := s.Update(t.Context(), lock, fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// write stores rows (see writeRows) in one transaction.
func write(t *testing.T, s store.Store, rows ...any) {
	t.Helper()
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return writeRows(ctx, tx, rows...) })
}

// counterRow is a RaiseCounter call.
type counterRow struct {
	ExecutionID, DispatchID, Kind, Target, ArgsHash string
	Consumed                                        int64
}

func (c counterRow) key() counterKey {
	return counterKey{c.ExecutionID, c.DispatchID, c.Kind, c.Target, c.ArgsHash}
}

type counterKey struct{ ExecutionID, DispatchID, Kind, Target, ArgsHash string }

func writeRows(ctx context.Context, tx store.Tx, rows ...any) error {
	for _, r := range rows {
		var err error
		switch r := r.(type) {
		case *store.Execution:
			err = tx.InsertExecution(ctx, r)
		case []*store.Event:
			err = tx.AppendEvents(ctx, r)
		case *store.Step:
			err = tx.InsertStep(ctx, r)
		case []*store.Step:
			for _, st := range r {
				if err = tx.InsertStep(ctx, st); err != nil {
					break
				}
			}
		case *store.Dispatch:
			err = tx.InsertDispatch(ctx, r)
		case counterRow:
			err = tx.RaiseCounter(ctx, r.ExecutionID, r.DispatchID, r.Kind, r.Target, r.ArgsHash, r.Consumed)
		case *store.Agent:
			err = tx.UpsertAgent(ctx, r)
		case *store.IdempotencyRecord:
			err = tx.InsertIdempotency(ctx, r)
		default:
			err = fmt.Errorf("storetest: cannot write %T", r)
		}
		if err != nil {
			return fmt.Errorf("write %T: %w", r, err)
		}
	}
	return nil
}

// result carries a read's outcome to get, which fails the test on error:
// val(r.Execution(ctx, id)).get(t, "Execution").
type result[T any] struct {
	v   T
	err error
}

func val[T any](v T, err error) result[T] { return result[T]{v, err} }

func (r result[T]) get(t *testing.T, what string) T {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r.v
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("%s: got error %v, want store.ErrNotFound", what, err)
	}
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	bytesType = reflect.TypeFor[[]byte]()
	listType  = reflect.TypeFor[[]string]()
)

// diff lists the fields in which got differs from want (both pointers to, or
// values of, the same struct type). Times compare as instants and zero only
// equals zero; byte slices compare byte for byte, and a nil want (no value)
// needs a nil got; string lists compare element by element in order, nil
// equal to empty.
func diff(got, want any) []string {
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	if gv.Kind() == reflect.Pointer {
		if gv.IsNil() || wv.IsNil() {
			if gv.IsNil() != wv.IsNil() {
				return []string{fmt.Sprintf("got %v, want %v", got, want)}
			}
			return nil
		}
		gv, wv = gv.Elem(), wv.Elem()
	}
	var out []string
	for i := range gv.NumField() {
		f := gv.Type().Field(i)
		g, w := gv.Field(i), wv.Field(i)
		ok := true
		switch f.Type {
		case timeType:
			gt, wt := g.Interface().(time.Time), w.Interface().(time.Time)
			ok = gt.IsZero() == wt.IsZero() && gt.Equal(wt)
		case bytesType:
			gb, wb := g.Bytes(), w.Bytes()
			ok = bytes.Equal(gb, wb) && (wb != nil || gb == nil)
		case listType:
			ok = slices.Equal(g.Interface().([]string), w.Interface().([]string))
		default:
			ok = reflect.DeepEqual(g.Interface(), w.Interface())
		}
		if !ok {
			out = append(out, fmt.Sprintf("%s: got %s, want %s", f.Name, show(g), show(w)))
		}
	}
	return out
}

func show(v reflect.Value) string {
	switch v.Type() {
	case timeType:
		tm := v.Interface().(time.Time)
		if tm.IsZero() {
			return "zero time"
		}
		return tm.Format(time.RFC3339Nano)
	case bytesType:
		b := v.Bytes()
		if b == nil {
			return "nil"
		}
		if len(b) > 80 {
			return fmt.Sprintf("%q... (%d bytes)", b[:80], len(b))
		}
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%#v", v.Interface())
}

// same reports every field in which got differs from want.
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if d := diff(got, want); len(d) > 0 {
		t.Errorf("%s differs:\n  %s", what, strings.Join(d, "\n  "))
	}
}

func sameList[T any](t *testing.T, what string, got, want []T) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %d rows, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		same(t, fmt.Sprintf("%s[%d]", what, i), got[i], want[i])
	}
}

func sameStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

// pluck maps each element of l to one of its fields.
func pluck[T, V any](l []T, field func(T) V) []V {
	out := make([]V, len(l))
	for i, x := range l {
		out[i] = field(x)
	}
	return out
}

func refIDs(refs []store.DispatchRef) []string {
	return pluck(refs, func(r store.DispatchRef) string { return r.ID })
}

func executionIDs(l []*store.Execution) []string {
	return pluck(l, func(e *store.Execution) string { return e.ID })
}

func stepIDs(l []*store.Step) []string {
	return pluck(l, func(s *store.Step) string { return s.StepID })
}

func eventSeqs(l []*store.Event) []int64 {
	return pluck(l, func(e *store.Event) int64 { return e.Seq })
}

func sorted(l []string) []string {
	c := slices.Clone(l)
	slices.Sort(c)
	return c
}
