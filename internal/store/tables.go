package store

import "context"

// TableReader reads a database whole, table by table, as `rebuno store
// copy` moves a development database into server mode: row for row, with
// nothing interpreted on the way, so that nothing can be lost in a
// translation.
type TableReader interface {
	// Tables lists the tables that hold the kernel's data (not the
	// backend's own bookkeeping, such as its schema version), with their
	// columns.
	Tables(ctx context.Context) (map[string][]string, error)
	// ScanTable calls fn with each row of table, its values in the order
	// of columns, each an int64, a string, a []byte or nil. The values are
	// fn's to keep.
	ScanTable(ctx context.Context, table string, columns []string, fn func(values []any) error) error
}
