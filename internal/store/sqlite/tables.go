package sqlite

import (
	"context"
	"fmt"
	"strings"

	"github.com/rebuno/rebuno/internal/store"
)

var _ store.TableReader = (*Store)(nil)

// Tables implements store.TableReader: every table but SQLite's own and
// the schema version.
func (s *Store) Tables(ctx context.Context) (map[string][]string, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT name FROM sqlite_schema
 WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_version'`)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	tables := map[string][]string{}
	for _, name := range names {
		cols, err := s.read.QueryContext(ctx, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, name)
		if err != nil {
			return nil, err
		}
		for cols.Next() {
			var col string
			if err := cols.Scan(&col); err != nil {
				cols.Close()
				return nil, err
			}
			tables[name] = append(tables[name], col)
		}
		cols.Close()
		if err := cols.Err(); err != nil {
			return nil, err
		}
	}
	return tables, nil
}

// ScanTable implements store.TableReader.
func (s *Store) ScanTable(ctx context.Context, table string, columns []string, fn func(values []any) error) error {
	quoted := make([]string, len(columns))
	for i, c := range columns {
		quoted[i] = quote(c)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+strings.Join(quoted, ", ")+` FROM `+quote(table))
	if err != nil {
		return fmt.Errorf("read table %s: %w", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		values := make([]any, len(columns))
		ptrs := make([]any, len(columns))
		for i := range values {
			ptrs[i] = &values[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("read table %s: %w", table, err)
		}
		if err := fn(values); err != nil {
			return err
		}
	}
	return rows.Err()
}

// quote makes a name an SQL identifier.
func quote(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }
