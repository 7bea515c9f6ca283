package repl

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/cli"
)

// Split breaks a line into words like a POSIX shell does for simple cases:
// whitespace separates words; '…' quotes literally; "…" quotes with \" and
// \\ escapes; a backslash outside quotes escapes the next character. So
// `exec create researcher '{"topic": "x"}'` passes the JSON as one word.
func Split(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			inWord = true
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated ' quote")
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
		case c == '"':
			inWord = true
			closed := false
			for i++; i < len(line); i++ {
				if line[i] == '\\' && i+1 < len(line) && (line[i+1] == '"' || line[i+1] == '\\') {
					i++
					cur.WriteByte(line[i])
					continue
				}
				if line[i] == '"' {
					closed = true
					break
				}
				cur.WriteByte(line[i])
			}
			if !closed {
				return nil, errors.New(`unterminated " quote`)
			}
		case c == '\\' && i+1 < len(line):
			inWord = true
			i++
			cur.WriteByte(line[i])
		default:
			inWord = true
			cur.WriteByte(c)
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// completer completes verbs, execution ids and agent ids (readline's
// AutoCompleter).
type completer struct {
	r *REPL

	mu      sync.Mutex
	words   map[string][]string
	execs   []string
	agents  []string
	pending []string // short ids of pending approvals
	fetched time.Time
}

// invalidate drops cached ids after a command may have changed them.
func (c *completer) invalidate() {
	c.mu.Lock()
	c.fetched = time.Time{}
	c.mu.Unlock()
}

// idVerbs take an execution id as their first argument; agentVerbs an
// agent id.
var (
	idVerbs    = map[string]bool{"get": true, "events": true, "watch": true, "cancel": true, "fork": true, "forks": true, "coverage": true}
	agentVerbs = map[string]bool{"get": true, "rm": true, "delete": true}
	execNouns  = map[string]bool{"exec": true, "execution": true, "executions": true}
	agentNouns = map[string]bool{"agent": true, "agents": true}
	// `policy set|get|rm <agent>`, `approvals get|grant|deny <approval>`.
	policyNouns    = map[string]bool{"policy": true, "policies": true}
	policyVerbs    = map[string]bool{"set": true, "get": true, "rm": true, "delete": true}
	approvalNouns  = map[string]bool{"approvals": true, "approval": true}
	approvalIDVerb = map[string]bool{"get": true, "grant": true, "deny": true}
)

// Do implements readline.AutoCompleter: it returns the endings of the
// candidates that start with the word under the cursor, and that word's
// length.
func (c *completer) Do(line []rune, pos int) ([][]rune, int) {
	before := string(line[:pos])
	words := strings.Fields(before)
	current := ""
	if len(words) > 0 && !strings.HasSuffix(before, " ") {
		current = words[len(words)-1]
		words = words[:len(words)-1]
	}
	cands := c.candidates(words, current)
	var out [][]rune
	for _, s := range cands {
		if strings.HasPrefix(s, current) && s != current {
			out = append(out, []rune(s[len(current):]+" "))
		}
	}
	return out, len([]rune(current))
}

// Candidates returns the completions of the word after words.
func (c *completer) candidates(words []string, current string) []string {
	tree := c.tree()
	switch len(words) {
	case 0:
		top := []string{"help", "quit", "exit"}
		for n := range tree {
			top = append(top, n)
		}
		sort.Strings(top)
		return top
	case 1:
		if words[0] == "help" {
			var nouns []string
			for n := range tree {
				nouns = append(nouns, n)
			}
			sort.Strings(nouns)
			return nouns
		}
		return tree[words[0]]
	}
	if strings.HasPrefix(current, "-") {
		return nil
	}
	noun, verb := words[0], words[1]
	positional := 0
	for _, w := range words[2:] {
		if !strings.HasPrefix(w, "-") {
			positional++
		}
	}
	if positional > 0 {
		return nil
	}
	switch {
	case execNouns[noun] && idVerbs[verb]:
		execs, _ := c.ids()
		return execs
	case execNouns[noun] && verb == "create", agentNouns[noun] && agentVerbs[verb], policyNouns[noun] && policyVerbs[verb]:
		_, agents := c.ids()
		return agents
	case approvalNouns[noun] && approvalIDVerb[verb]:
		c.ids()
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.pending
	}
	return nil
}

func (c *completer) tree() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.words == nil {
		c.words = c.r.tree()
	}
	return c.words
}

// ids returns the short ids of the newest executions and the agent ids,
// cached for two seconds.
func (c *completer) ids() (execs, agents []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.fetched) < 2*time.Second {
		return c.execs, c.agents
	}
	c.fetched = time.Now()
	cl := cli.NewClient(strings.TrimRight(c.r.opt.URL, "/"), c.r.opt.Token, "", 2*time.Second, c.r.opt.Version)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var page struct {
		Executions []struct {
			ID string `json:"id"`
		} `json:"executions"`
	}
	c.execs = nil
	if _, err := cl.GetJSON(ctx, "/v0/executions?limit=100", &page); err == nil {
		for _, e := range page.Executions {
			c.execs = append(c.execs, cli.ShortID(e.ID))
		}
	}
	var list []json.RawMessage
	c.agents = nil
	if _, err := cl.GetJSON(ctx, "/v0/agents", &list); err == nil {
		for _, raw := range list {
			var a struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(raw, &a) == nil {
				c.agents = append(c.agents, a.ID)
			}
		}
	}
	var approvals []struct {
		ID string `json:"id"`
	}
	c.pending = nil
	if _, err := cl.GetJSON(ctx, "/v0/approvals?status=pending", &approvals); err == nil {
		for _, ap := range approvals {
			c.pending = append(c.pending, cli.ShortID(ap.ID))
		}
	}
	return c.execs, c.agents
}
