package sqlstore

import (
	"slices"
	"strings"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// RowCache keeps the execution heads and dispatch rows that a backend's
// transactions last read or wrote, so that the two reads every agent request
// begins with (four of the 21 statements a step ran without it) skip SQL.
// Only a backend whose transactions are the only writers of its database may
// use one, from one goroutine: the SQLite writer. Postgres runs many
// replicas against one database, so it never does.
//
// The cache holds what a read would return, never more: a write the cache
// cannot follow exactly drops the entry, a statement it cannot follow at
// all clears it (see Tx.exec), and the backend clears it whenever writes are
// undone (a transaction or a commit that failed) or someone else wrote the
// database.
type RowCache struct {
	executions map[string]*store.Execution
	dispatches map[string]*store.Dispatch
}

// rowCacheSize bounds each of the cache's maps: about a thousand bytes an
// entry. Live executions beyond it are read from SQL as before; finished
// ones are not kept, since their rows are rarely written again.
const rowCacheSize = 4096

// NewRowCache returns an empty cache.
func NewRowCache() *RowCache {
	return &RowCache{executions: map[string]*store.Execution{}, dispatches: map[string]*store.Dispatch{}}
}

// Clear forgets everything.
func (c *RowCache) Clear() {
	clear(c.executions)
	clear(c.dispatches)
}

// Holds reports whether the cache holds the execution or dispatch id (for
// tests).
func (c *RowCache) Holds(id string) bool {
	_, e := c.executions[id]
	_, d := c.dispatches[id]
	return e || d
}

// put stores v under key, making room by forgetting an arbitrary entry.
func put[T any](m map[string]*T, key string, v *T) {
	if _, ok := m[key]; !ok && len(m) >= rowCacheSize {
		for k := range m {
			delete(m, k)
			break
		}
	}
	m[key] = v
}

// execution returns a copy of the cached head of id.
func (c *RowCache) execution(id string) (*store.Execution, bool) {
	e, ok := c.executions[id]
	if !ok {
		return nil, false
	}
	return copyHead(e), true
}

// keepExecution caches a copy of a live execution's head as a read returned
// it.
func (c *RowCache) keepExecution(e *store.Execution) {
	if wire.ExecTerminal(e.Status) {
		delete(c.executions, e.ID)
		return
	}
	put(c.executions, e.ID, copyHead(e))
}

// updatedExecution follows UpdateExecution: the columns it writes, as a read
// would return them, over the cached row; without one there is nothing to
// follow. keys and writing are the two lists as UpdateExecution encoded them.
func (c *RowCache) updatedExecution(e *store.Execution, keys, writing string) {
	old, ok := c.executions[e.ID]
	if !ok {
		return
	}
	if wire.ExecTerminal(e.Status) {
		delete(c.executions, e.ID)
		return
	}
	resourceKeys, err := decodeList(keys)
	if err != nil {
		delete(c.executions, e.ID)
		return
	}
	writers, err := decodeList(writing)
	if err != nil {
		delete(c.executions, e.ID)
		return
	}
	old.Status = e.Status
	old.FailureReason = e.FailureReason
	old.UpdatedAt = fromTS(ts(e.UpdatedAt))
	old.ResourceKeys, old.Writing = resourceKeys, writers
	old.DispatchID = e.DispatchID
	old.LastSeq, old.StepOrder, old.StepCount, old.ByteCount = e.LastSeq, e.StepOrder, e.StepCount, e.ByteCount
	old.Mark = cloneMark(e.Mark)
}

// dispatch returns a copy of the cached dispatch id.
func (c *RowCache) dispatch(id string) (*store.Dispatch, bool) {
	d, ok := c.dispatches[id]
	if !ok {
		return nil, false
	}
	cp := *d
	return &cp, true
}

func (c *RowCache) keepDispatch(d *store.Dispatch) {
	cp := *d
	put(c.dispatches, d.ID, &cp)
}

// retired follows RetireDispatches: the execution's other dispatches are
// forgotten rather than rewritten.
func (c *RowCache) retired(executionID, keepID string) {
	for id, d := range c.dispatches {
		if d.ExecutionID == executionID && id != keepID {
			delete(c.dispatches, id)
		}
	}
}

// touches reports whether a statement may write rows the cache holds.
func touches(query string) bool {
	return strings.Contains(query, "executions") || strings.Contains(query, "dispatches")
}

// copyHead copies an execution's head: the row without its user values.
func copyHead(e *store.Execution) *store.Execution {
	cp := *e
	cp.Input, cp.Output, cp.State = nil, nil, nil
	cp.ResourceKeys = slices.Clone(e.ResourceKeys)
	if e.ResourceKeys != nil && cp.ResourceKeys == nil {
		cp.ResourceKeys = []string{}
	}
	cp.Writing = slices.Clone(e.Writing)
	if e.Writing != nil && cp.Writing == nil {
		cp.Writing = []string{}
	}
	cp.Restoration = slices.Clone(e.Restoration)
	cp.ForkExcluded = nil
	cp.Mark = cloneMark(e.Mark)
	return &cp
}
