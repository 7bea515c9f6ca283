package cli

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
)

// executionPages reads the execution pages at path (docs/protocol/executions.md §4), from cursor,
// limit executions a page (0: the kernel's default), following next_cursor
// when all is set. With --json each execution is written as a JSON line
// (without --all, the first page as it came); otherwise row is called for
// each. It returns how many executions it read and the cursor of the page
// after the last one read ("" at the end).
func (a *App) executionPages(ctx context.Context, cl *Client, path string, filters url.Values, cursor string,
	limit int, all bool, row func(Execution)) (count int, next string, err error) {
	for {
		q := url.Values{}
		for k, v := range filters {
			q[k] = v
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		target := path
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		var page Page
		raw, err := cl.GetJSON(ctx, target, &page)
		if err != nil {
			return count, cursor, err
		}
		if a.json && !all {
			writeJSONLine(a.Out(), raw)
			return len(page.Executions), page.NextCursor, nil
		}
		for _, r := range page.Executions {
			count++
			if a.json {
				writeJSONLine(a.Out(), r)
				continue
			}
			var e Execution
			json.Unmarshal(r, &e)
			row(e)
		}
		cursor = page.NextCursor
		if !all || cursor == "" {
			return count, cursor, nil
		}
	}
}
