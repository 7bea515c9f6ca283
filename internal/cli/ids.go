package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
)

// ShortIDLen is how many hex digits `exec ls` shows (docs/protocol/configuration.md §6.2).
const ShortIDLen = 8

// MinSuffixLen is the shortest suffix accepted as an id.
const MinSuffixLen = 6

// suffixWindow is how many of the newest executions a suffix is matched
// against.
const suffixWindow = 200

// ShortID returns the last 8 hex digits of a UUID (the end of its random
// group; a prefix would not do: UUIDv7 ids of the same minute share it).
func ShortID(id string) string {
	if len(id) < ShortIDLen {
		return id
	}
	return id[len(id)-ShortIDLen:]
}

// isFullUUID reports whether s is a canonical UUID (any case).
func isFullUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// ResolveExecution turns a full UUID or a unique suffix of at least six hex
// digits of its last group (among the newest 200 executions) into a full id.
func (a *App) ResolveExecution(ctx context.Context, arg string) (string, error) {
	arg = strings.TrimSpace(arg)
	if isFullUUID(arg) {
		return strings.ToLower(arg), nil
	}
	if !isHex(arg) || len(arg) < MinSuffixLen || len(arg) > 12 {
		return "", &UsageError{Msg: fmt.Sprintf("invalid execution id %q: give the full id, or the last %d to 12 hex digits of it (as `rebuno exec ls` shows)", arg, MinSuffixLen)}
	}
	suffix := strings.ToLower(arg)
	c, err := a.Client()
	if err != nil {
		return "", err
	}
	var page Page
	if _, err := c.GetJSON(ctx, fmt.Sprintf("/v0/executions?limit=%d", suffixWindow), &page); err != nil {
		return "", err
	}
	var matches []Execution
	for _, raw := range page.Executions {
		var e Execution
		if json.Unmarshal(raw, &e) == nil && strings.HasSuffix(e.ID, suffix) {
			matches = append(matches, e)
		}
	}
	switch len(matches) {
	case 1:
		return matches[0].ID, nil
	case 0:
		return "", notFound(fmt.Sprintf("no execution id ends with %q among the newest %d executions", suffix, suffixWindow),
			"give the full execution id (`rebuno exec ls --all` lists every execution)")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ambiguous execution id %q: it ends %d executions:", suffix, len(matches))
	for i, e := range matches {
		if i == 10 {
			fmt.Fprintf(&b, "\n  … and %d more", len(matches)-10)
			break
		}
		fmt.Fprintf(&b, "\n  %s  %s  %s  %s", e.ID, e.AgentID, e.Status, e.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"))
	}
	b.WriteString("\ngive more digits, or the full id")
	return "", &UsageError{Msg: b.String()}
}

// completeExecutions offers the short ids of the newest executions to shell
// completion (`rebuno completion bash|zsh|fish`).
func (a *App) completeExecutions(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.Client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var page struct {
		Executions []Execution `json:"executions"`
	}
	if _, err := c.GetJSON(ctxOf(cmd), "/v0/executions?limit=100", &page); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, e := range page.Executions {
		out = append(out, ShortID(e.ID)+"\t"+e.AgentID+" "+e.Status)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeAgents offers the registered agent ids to shell completion.
func (a *App) completeAgents(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	c, err := a.Client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var agents []Agent
	if _, err := c.GetJSON(ctxOf(cmd), "/v0/agents", &agents); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, ag := range agents {
		out = append(out, ag.ID)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
