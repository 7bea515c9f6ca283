package postgres_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	"github.com/rebuno/rebuno/internal/store/storetest"
)

// TestQueriesUseIndexes runs the store contract suite, collects every query
// the SQL layer ran, and asks Postgres for the generic plan of each on the
// real schema with sequential scans priced out of reach (enable_seqscan
// off): a scan that remains has no index to use instead. None may scan a
// table whose size grows with use, unless it is listed below with the
// reason the scan is bounded. The planner of an empty database would scan
// every table, so its choice between a scan and an index is not what is
// tested; whether an index exists that serves each query is. SQLite's
// TestQueriesUseIndexes holds the same for `rebuno dev`.
func TestQueriesUseIndexes(t *testing.T) {
	queries := storetest.Queries(t, open, postgres.SetQueryHook)

	conn, err := pgx.Connect(t.Context(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, set := range []string{"SET enable_seqscan = off", "SET plan_cache_mode = force_generic_plan"} {
		if _, err := conn.Exec(t.Context(), set); err != nil {
			t.Fatal(err)
		}
	}

	// Tables whose size grows with use.
	grows := map[string]bool{"steps": true, "events": true, "event_runs": true, "executions": true, "execution_values": true,
		"dispatches": true, "counters": true, "approvals": true, "idempotency_keys": true, "checkpoints": true,
		"rate_limit_marks": true, "resources": true, "audit_log": true, "sessions": true}
	// A node that reads a whole table: a sequential scan, or an index scan
	// without a condition on the index (what the planner falls back to when
	// sequential scans are off and the query's order matches an index).
	node := regexp.MustCompile(`(Seq Scan|Index Scan|Index Only Scan) (?:using \w+ )?on (\w+)`)
	// Index scans without a condition that are bounded nonetheless, by a
	// fragment of the query, with the reason. A sequential scan never is.
	allowed := map[string]string{
		// The smallest value of a column an index orders is the index's
		// first entry (a partial index holds only the rows asked about).
		"SELECT MIN(": "first entry",
	}
	verbose := os.Getenv("REBUNO_PRINT_PLANS") != ""

	for _, q := range queries {
		plan, err := explain(t.Context(), conn, q)
		if err != nil {
			t.Errorf("explain %q: %v", q, err)
			continue
		}
		if verbose { // REBUNO_PRINT_PLANS=1 go test -run TestQueriesUseIndexes -v ./internal/store/postgres
			t.Logf("%s\n%s", strings.Join(strings.Fields(q), " "), strings.Join(plan, "\n"))
		}
		for i, line := range plan {
			m := node.FindStringSubmatch(line)
			if m == nil || !grows[m[2]] || m[1] != "Seq Scan" && conditioned(plan[i+1:]) {
				continue
			}
			ok := false
			for frag := range allowed {
				ok = ok || m[1] != "Seq Scan" && strings.Contains(q, frag)
			}
			if !ok {
				t.Errorf("reads all of %s: %s\n  in: %s", m[2], strings.TrimSpace(line), strings.Join(strings.Fields(q), " "))
			}
		}
	}
}

// conditioned reports whether a plan node, given the lines after its own,
// has an index condition among its details (which run until the next node).
func conditioned(details []string) bool {
	for _, l := range details {
		if strings.Contains(l, "->") {
			return false
		}
		if strings.Contains(l, "Index Cond:") {
			return true
		}
	}
	return false
}

// explain is Postgres's generic plan of q, one line per node, with every
// parameter NULL.
func explain(ctx context.Context, conn *pgx.Conn, q string) ([]string, error) {
	if _, err := conn.Exec(ctx, "PREPARE plan_check AS "+q); err != nil {
		return nil, err
	}
	defer conn.Exec(context.Background(), "DEALLOCATE plan_check")
	n := parameters(q)
	nulls := strings.TrimSuffix(strings.Repeat("NULL,", n), ",")
	query := "EXPLAIN EXECUTE plan_check"
	if n > 0 {
		query += "(" + nulls + ")"
	}
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return nil, err
		}
		out = append(out, line)
	}
	return out, rows.Err()
}

// parameters is the largest $N of q.
func parameters(q string) int {
	largest := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(q, -1) {
		if n, _ := strconv.Atoi(m[1]); n > largest {
			largest = n
		}
	}
	return largest
}
