package postgres

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rebuno/rebuno/internal/store/sqlstore"
)

// dialect is Postgres's side of the SQL seam (sqlstore.Dialect).
type dialect struct{}

// Rebind turns sqlstore's placeholders into Postgres's: '?N' becomes '$N'
// and a bare '?' takes the number after the largest one used so far, as
// SQLite numbers them. Text inside single quotes is left alone. Queries are
// rewritten once and remembered.
func (dialect) Rebind(query string) string {
	v, ok := rebound.Load(query)
	if !ok {
		v = rebind(query)
		if reboundCount.Add(1) <= maxRebound {
			rebound.Store(query, v)
		}
	}
	if hook := queryHook.Load(); hook != nil {
		(*hook)(v.(string))
	}
	return v.(string)
}

// queryHook, when set (by tests), sees every query the SQL layer runs, as
// Postgres receives it.
var queryHook atomic.Pointer[func(query string)]

// maxRebound bounds the remembered queries: multi-row inserts differ by
// their row counts, and beyond the bound they are simply rewritten again.
const maxRebound = 4096

var (
	rebound      sync.Map
	reboundCount atomic.Int64
)

func rebind(query string) string {
	var b strings.Builder
	b.Grow(len(query) + 16)
	highest, quoted := 0, false
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c == '\'' {
			quoted = !quoted
		}
		if c != '?' || quoted {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		n := highest + 1
		if j > i+1 {
			n, _ = strconv.Atoi(query[i+1 : j])
		}
		highest = max(highest, n)
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
		i = j - 1
	}
	return b.String()
}

// IndexedBy: Postgres plans with statistics and needs no hints.
func (dialect) IndexedBy(string) string { return "" }

// RowLock: writers run side by side on many connections and replicas.
func (dialect) RowLock(mode sqlstore.RowLock) string {
	switch mode {
	case sqlstore.LockUpdateSkip:
		return " FOR UPDATE SKIP LOCKED"
	case sqlstore.LockKeyShare:
		return " FOR KEY SHARE"
	}
	return " FOR UPDATE"
}

// KeyLock is a transaction-scoped advisory lock.
func (dialect) KeyLock() string { return "SELECT pg_advisory_xact_lock(?)" }

// Classify implements sqlstore.Dialect (errors.go).
func (dialect) Classify(err error) error { return classify(err) }
