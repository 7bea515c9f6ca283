package wire

import (
	"strings"
	"time"
)

// FormatTime writes t as RFC 3339 in UTC with up to nine fractional digits
// and no trailing zeros (docs/protocol/README.md §3).
func FormatTime(t time.Time) string {
	s := t.UTC().Format("2006-01-02T15:04:05.000000000")
	s = strings.TrimRight(s, "0")
	s = strings.TrimSuffix(s, ".")
	return s + "Z"
}
