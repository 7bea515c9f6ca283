package sqlite

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/store/storetest"
)

// TestQueriesUseIndexes runs the store contract suite, collects every query
// the store ran, and asks SQLite how it would run each on the real schema:
// none may scan a table whose size grows with use, unless it is listed
// below with the reason the scan is bounded. A query that stops using its
// index (a partial index whose WHERE no longer matches, an ORDER BY that
// draws the planner to another index) fails here instead of slowing down
// with the history.
func TestQueriesUseIndexes(t *testing.T) {
	queries := storetest.Queries(t, openFile, func(hook func(string)) { preparedHook = hook })

	s := openAt(t, filepath.Join(t.TempDir(), "plans.db"), nil)
	conn, err := s.read.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// Tables whose size grows with use, by the names and aliases the
	// queries give them.
	grows := map[string]bool{"steps": true, "s": true, "b": true, "events": true, "event_runs": true,
		"executions": true, "e": true, "execution_values": true, "v": true, "dispatches": true, "counters": true,
		"approvals": true, "idempotency_keys": true, "checkpoints": true, "rate_limit_marks": true, "resources": true}
	scan := regexp.MustCompile(`^SCAN (\w+)`)
	// Scans that are bounded, by a fragment of the query, with the reason.
	allowed := map[string]string{
		// A keyset page walks the primary key from its end and stops at
		// LIMIT rows.
		"ORDER BY e.id DESC LIMIT ?": "keyset page",
	}
	// Queries that must use a given index, by a fragment of the query: a
	// partial index, which only a WHERE repeating its own can use, or one
	// that SQLite without statistics would pass over for a worse one.
	required := map[string]string{
		"deadline_at <= ?":            "executions_live_deadline",
		"MIN(deadline_at)":            "executions_live_deadline",
		"AND updated_at < ?":          "executions_terminal_age",
		"WHERE body_execution_id = ?": "steps_by_body",
		"AND agent_id = ? LIMIT 1":    "executions_by_status",
	}
	found := map[string]bool{}
	verbose := os.Getenv("REBUNO_PRINT_PLANS") != ""

	for _, q := range queries {
		plan, err := explain(t.Context(), conn, q)
		if err != nil {
			t.Errorf("explain %q: %v", q, err)
			continue
		}
		if verbose { // REBUNO_PRINT_PLANS=1 go test -run TestQueriesUseIndexes -v ./internal/store/sqlite
			t.Logf("%s\n  -> %s", strings.Join(strings.Fields(q), " "), strings.Join(plan, " | "))
		}
		for frag, index := range required {
			if strings.Contains(q, frag) {
				found[frag] = true
				if !strings.Contains(strings.Join(plan, "\n"), "INDEX "+index+" ") {
					t.Errorf("does not use %s: %s\n  in: %s", index, strings.Join(plan, " | "), strings.Join(strings.Fields(q), " "))
				}
			}
		}
		for _, line := range plan {
			m := scan.FindStringSubmatch(line)
			if m == nil || !grows[m[1]] {
				continue
			}
			ok := false
			for frag := range allowed {
				if strings.Contains(q, frag) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s\n  in: %s", line, strings.Join(strings.Fields(q), " "))
			}
		}
	}
	for frag := range required {
		if !found[frag] {
			t.Errorf("no query containing %q ran: the contract suite or this list is out of date", frag)
		}
	}
}

// explain is SQLite's query plan of q, one line per step, with every
// parameter NULL.
func explain(ctx context.Context, conn *sql.Conn, q string) ([]string, error) {
	args := make([]any, parameters(q))
	rows, err := conn.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			return nil, err
		}
		out = append(out, detail)
	}
	return out, rows.Err()
}

// parameters counts q's parameters as SQLite numbers them: "?N" is number
// N, and a bare "?" the number after the largest so far. Quoted text is
// skipped.
func parameters(q string) int {
	largest := 0
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case '\'':
			for i++; i < len(q) && q[i] != '\''; i++ {
			}
		case '?':
			j := i + 1
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				j++
			}
			if j == i+1 {
				largest++
			} else if n, _ := strconv.Atoi(q[i+1 : j]); n > largest {
				largest = n
			}
			i = j - 1
		}
	}
	return largest
}
