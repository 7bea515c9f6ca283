package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/charmbracelet/x/ansi"
)

// CompactJSON returns raw on one line with insignificant whitespace removed
// (key order and number literals untouched). Invalid JSON is returned as is,
// with line breaks replaced.
func CompactJSON(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return strings.NewReplacer("\n", " ", "\r", " ").Replace(string(raw))
	}
	return b.String()
}

// Truncate cuts s to at most n display columns, ending with "…" when cut.
func Truncate(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if ansi.StringWidth(s) <= n {
		return s
	}
	if n == 1 {
		return "…"
	}
	return ansi.Truncate(s, n, "…")
}

// FormatDuration prints a duration compactly: 0s, 406ms, 2.4s, 1m05s, 2h03m.
func FormatDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d == 0:
		return "0s"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < 10*time.Second:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", d.Seconds()), "0"), ".") + "s"
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// RelativeTime prints t relative to now: "just now", "3s ago", "5m ago",
// "2h ago", "3d ago", else the date.
func RelativeTime(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	future := d < 0
	if future {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d.Hours()))
	case d < 30*24*time.Hour:
		s = fmt.Sprintf("%dd", int(d.Hours())/24)
	default:
		return t.Local().Format("2006-01-02")
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// Timestamp prints t in RFC 3339 UTC (the kernel's own form).
func Timestamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// when prints a time for the current output mode: relative on a terminal,
// RFC 3339 otherwise.
func (a *App) when(t time.Time) string {
	if a.tty {
		return RelativeTime(t, a.now())
	}
	return Timestamp(t)
}

// table prints rows: aligned columns with a header on a terminal, tab
// separated without a header otherwise (for cut and awk). Cells may carry
// colour codes; alignment uses their display width.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) print(w io.Writer, tty bool, st styles) {
	if !tty {
		for _, r := range t.rows {
			fmt.Fprintln(w, strings.Join(r, "\t"))
		}
		return
	}
	widths := make([]int, len(t.header))
	all := append([][]string{t.header}, t.rows...)
	for _, r := range all {
		for i, c := range r {
			if i < len(widths) && ansi.StringWidth(c) > widths[i] {
				widths[i] = ansi.StringWidth(c)
			}
		}
	}
	for n, r := range all {
		var b strings.Builder
		for i, c := range r {
			if n == 0 {
				c = st.paint(st.bold, c)
			}
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-ansi.StringWidth(c)+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// prettyJSON prints a JSON value for a person after a label: on the same
// line when it fits in width, else on the following lines, indented.
func prettyJSON(raw []byte, width int) string {
	c := CompactJSON(raw)
	if utf8.RuneCountInString(c) <= width {
		return c
	}
	var b bytes.Buffer
	if json.Indent(&b, bytes.TrimSpace(raw), "    ", "  ") != nil {
		return c
	}
	return "\n    " + b.String()
}

// indentJSON lays a JSON value out on indented lines for a terminal (key
// order and number literals untouched); invalid JSON is returned as is.
func indentJSON(raw []byte) string {
	var b bytes.Buffer
	if json.Indent(&b, bytes.TrimSpace(raw), "", "  ") != nil {
		return string(bytes.TrimSpace(raw))
	}
	return b.String()
}

// labelJSON prints "label value" lines for a JSON value (see prettyJSON).
func labelJSON(w io.Writer, label string, raw []byte, width int) {
	v := prettyJSON(raw, width)
	if strings.HasPrefix(v, "\n") {
		fmt.Fprintf(w, "%s%s\n", label, v)
		return
	}
	fmt.Fprintf(w, "%s %s\n", label, v)
}

// writeJSONLine writes one kernel JSON value on one line.
func writeJSONLine(w io.Writer, raw []byte) {
	raw = bytes.TrimSpace(raw)
	if bytes.ContainsAny(raw, "\r\n") {
		raw = []byte(CompactJSON(raw))
	}
	w.Write(raw)
	w.Write([]byte{'\n'})
}
