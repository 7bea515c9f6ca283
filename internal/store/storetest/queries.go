package storetest

import (
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
)

// Queries runs the contract suite against stores from open while setHook
// has the store report every statement it prepares, and returns the data
// statements among them (SELECT, INSERT, UPDATE, DELETE, WITH), each once,
// sorted. Each backend's TestQueriesUseIndexes asks its database for the
// plan of each.
func Queries(t *testing.T, open func(t *testing.T) store.Store, setHook func(func(query string))) []string {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]bool{}
	setHook(func(q string) {
		mu.Lock()
		seen[q] = true
		mu.Unlock()
	})
	t.Cleanup(func() { setHook(nil) })
	t.Run("contract", func(t *testing.T) { Run(t, open) })
	setHook(nil)

	var queries []string
	for q := range seen {
		switch strings.ToUpper(strings.Fields(q)[0]) {
		case "SELECT", "INSERT", "UPDATE", "DELETE", "WITH":
			queries = append(queries, q)
		}
	}
	sort.Strings(queries)
	if len(queries) < 50 {
		t.Fatalf("only %d queries seen: is the hook wired?", len(queries))
	}
	return queries
}
