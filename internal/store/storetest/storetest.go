// Package storetest is the contract every store.Store backend must pass
// unchanged (docs/protocol/operations.md §2.1). A backend's own test calls Run with a function
// that opens a fresh, empty store, and RunDurability when its stores can be
// closed and opened again on the same data.
//
// The scenarios never call t.Fatal (or anything else of t) inside an Update
// function or an AfterCommit callback: a backend may run those on a goroutine
// of its own. They record what they see and the test goroutine asserts it.
package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

// base is the reference instant of every scenario. It has microsecond
// precision, the finest that every backend keeps.
var base = time.Date(2026, 12, 2, 9, 37, 43, 629821000, time.UTC)

func at(d time.Duration) time.Time { return base.Add(d) }

// errDeliberate is what scenarios return from a transaction they want rolled
// back.
var errDeliberate = errors.New("storetest: deliberate failure")

// panicMessage is what scenarios panic with inside a transaction.
const panicMessage = "storetest: deliberate panic"

// big is a limit larger than any scenario's row count.
const big = 1 << 20

type scenario struct {
	name string
	fn   func(t *testing.T, s store.Store)
}

// scenarios are every file's, in the order of the data path.
var scenarios = slices.Concat(
	executionScenarios,
	eventScenarios,
	stepScenarios,
	dispatchScenarios,
	agentScenarios,
	schedulingScenarios,
	transactionScenarios,
	notifierScenarios,
	accessScenarios,
	resourceScenarios,
	forkScenarios,
	inPlaceScenarios,
)

// Run runs every contract scenario as a subtest, each against a fresh store
// from open. open must return an empty store and arrange for it to be closed
// when the subtest ends (t.Cleanup); scenarios never close it themselves.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, open(t)) })
	}
}

type durabilityScenario struct {
	name string
	fn   func(t *testing.T, s store.Store, reopen func(t *testing.T, s store.Store) store.Store)
}

var durabilityScenarios = []durabilityScenario{
	{"AcknowledgedWritesSurvive", testAcknowledgedWritesSurvive},
	{"ReopenIsIdempotent", testReopenIsIdempotent},
	{"FinalStateSurvives", testFinalStateSurvives},
}

// RunDurability runs the scenarios that close a store and open it again.
// open is as for Run; reopen closes s and returns a store on the same data,
// arranging for the new store to be closed when the subtest ends.
func RunDurability(t *testing.T, open func(t *testing.T) store.Store, reopen func(t *testing.T, s store.Store) store.Store) {
	t.Helper()
	for _, sc := range durabilityScenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, open(t), reopen) })
	}
}
