package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/rebuno/rebuno/internal/store"
)

// Import copies another store's tables into this database row for row, in
// one transaction: when anything fails, nothing is written. Every table of
// the source must be a table here with the same columns, and every table
// here that holds the kernel's data must be in the source. Unless
// intoNonEmpty, a database that holds any row of those tables is refused
// (ErrNotEmpty); with it, the rows are added to what is there, and a row
// whose key is taken fails the import. Audit log entries keep their order
// and are numbered after the entries already here. It returns how many
// rows each table received.
func (s *Store) Import(ctx context.Context, src store.TableReader, intoNonEmpty bool) (map[string]int64, error) {
	from, err := src.Tables(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the source's tables: %w", err)
	}
	copied := map[string]int64{}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		to, err := tableColumns(ctx, tx)
		if err != nil {
			return err
		}
		if err := sameTables(from, to); err != nil {
			return err
		}
		names := make([]string, 0, len(to))
		for name := range to {
			names = append(names, name)
		}
		sort.Strings(names)
		var full []string
		for _, name := range names {
			var any bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{name}.Sanitize()+`)`).Scan(&any); err != nil {
				return err
			}
			if any {
				full = append(full, name)
			}
		}
		if len(full) > 0 && !intoNonEmpty {
			return fmt.Errorf("%w: %s", ErrNotEmpty, strings.Join(full, ", "))
		}
		for _, name := range names {
			n, err := importTable(ctx, tx, src, name, to[name], slices.Contains(full, name))
			if err != nil {
				return fmt.Errorf("copy table %s: %w", name, err)
			}
			copied[name] = n
		}
		return nil
	})
	if err != nil {
		return nil, classify(err)
	}
	return copied, nil
}

// ErrNotEmpty refuses an import into a database that already holds data.
var ErrNotEmpty = errors.New("the destination database is not empty")

// serverOnly are this store's tables that no other backend has: its
// schema's version and what replicas share only while they run.
var serverOnly = []string{"schema_migrations", "rate_buckets", "notification_payloads"}

// column is a column of this database's schema.
type column struct{ name, typ string }

// tableColumns lists the tables of the kernel's data in this database with
// their columns, in order.
func tableColumns(ctx context.Context, tx pgx.Tx) (map[string][]column, error) {
	rows, err := tx.Query(ctx, `SELECT table_name, column_name, data_type FROM information_schema.columns
 WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	tables := map[string][]column{}
	for rows.Next() {
		var table string
		var c column
		if err := rows.Scan(&table, &c.name, &c.typ); err != nil {
			return nil, err
		}
		if !slices.Contains(serverOnly, table) {
			tables[table] = append(tables[table], c)
		}
	}
	return tables, rows.Err()
}

// sameTables checks that source and destination hold the same tables with
// the same columns.
func sameTables(from map[string][]string, to map[string][]column) error {
	var problems []string
	for table, cols := range from {
		dst, ok := to[table]
		if !ok {
			problems = append(problems, "table "+table+" is missing here")
			continue
		}
		names := make([]string, len(dst))
		for i, c := range dst {
			names[i] = c.name
		}
		a, b := slices.Sorted(slices.Values(cols)), slices.Sorted(slices.Values(names))
		if !slices.Equal(a, b) {
			problems = append(problems, fmt.Sprintf("table %s has columns %v in the source, %v here", table, a, b))
		}
	}
	for table := range to {
		if _, ok := from[table]; !ok {
			problems = append(problems, "table "+table+" is missing from the source")
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("the source's schema does not match this one: %s", strings.Join(problems, "; "))
	}
	return nil
}

// importBatch bounds the rows held in memory between two COPYs.
const importBatch = 5000

// importTable copies one table. Values take this column's type (SQLite
// hands back text where a BLOB column was written a string, and the
// reverse). Audit entries are numbered after those already here when the
// table is not empty.
func importTable(ctx context.Context, tx pgx.Tx, src store.TableReader, table string, cols []column, full bool) (int64, error) {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	renumber := table == "audit_log" && full
	var (
		batch  [][]any
		copied int64
	)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		target := names
		if renumber {
			target = names[1:]
		}
		n, err := tx.CopyFrom(ctx, pgx.Identifier{table}, target, pgx.CopyFromRows(batch))
		copied += n
		batch = batch[:0]
		return err
	}
	err := src.ScanTable(ctx, table, names, func(values []any) error {
		for i, c := range cols {
			values[i] = convert(values[i], c.typ)
		}
		batch = append(batch, values)
		if table == "audit_log" || len(batch) < importBatch {
			return nil // the audit log is ordered whole first (below)
		}
		return flush()
	})
	if err != nil {
		return copied, err
	}
	if table == "audit_log" {
		if names[0] != "seq" {
			return 0, fmt.Errorf("the audit log's first column is %s, not seq", names[0])
		}
		sort.Slice(batch, func(i, j int) bool { return batch[i][0].(int64) < batch[j][0].(int64) })
		if renumber {
			for i := range batch {
				batch[i] = batch[i][1:]
			}
		}
	}
	if err := flush(); err != nil {
		return copied, err
	}
	if table == "audit_log" {
		// The identity continues after the entries copied with their seq.
		_, err = tx.Exec(ctx, `SELECT setval(pg_get_serial_sequence('audit_log', 'seq'), COALESCE(MAX(seq), 0) + 1, false) FROM audit_log`)
	}
	return copied, err
}

// convert makes a source value fit a column of type typ.
func convert(v any, typ string) any {
	switch x := v.(type) {
	case string:
		if typ == "bytea" {
			return []byte(x)
		}
	case []byte:
		if typ == "text" {
			return string(x)
		}
	}
	return v
}
