package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/wire"
)

// `rebuno keys …` and `rebuno audit`: scoped API keys and the audit log of
// what they did (admin role).

// APIKey is a key as the kernel lists it; Token is present only in the
// answer that created it.
type APIKey struct {
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	Token      string     `json:"token"`
	CreatedAt  time.Time  `json:"created_at"`
	CreatedBy  string     `json:"created_by"`
	ExpiresAt  *time.Time `json:"expires_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

// AuditEntry is one entry of the audit log.
type AuditEntry struct {
	Seq     int64           `json:"seq"`
	At      time.Time       `json:"at"`
	Actor   string          `json:"actor"`
	Action  string          `json:"action"`
	Subject string          `json:"subject"`
	Detail  json.RawMessage `json:"detail"`
}

func init() {
	RegisterNoun(func(a *App) *cobra.Command { return a.keysCommand() })
	RegisterNoun(func(a *App) *cobra.Command { return a.auditCommand() })
}

func (a *App) keysCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "keys <command>",
		Aliases: []string{"key"},
		Short:   "Create, list and revoke scoped API keys",
		Long: "API keys give people and programs their own credentials, each with a role:\n" +
			"  viewer    reads everything\n" +
			"  approver  reads, and grants or denies approvals (recorded under the key's name)\n" +
			"  operator  also creates, cancels and forks executions\n" +
			"  admin     everything, agents, policies and keys included\n\n" +
			"A key's token is printed once, when it is created; the kernel keeps only its hash.\n" +
			"Send it as the bearer token (--token, $REBUNO_API_KEY). Names are never reused.",
		Example: "  rebuno keys create --name alice --role approver --expires 30d\n" +
			"  rebuno keys ls\n" +
			"  rebuno keys revoke alice",
	}
	c.AddCommand(a.keysCreate(), a.keysLs(), a.keysRevoke())
	return c
}

func (a *App) keysCreate() *cobra.Command {
	var name, role, expires string
	c := &cobra.Command{
		Use:   "create --name NAME --role ROLE [--expires 30d]",
		Short: "Create a key and print its token (shown only this once)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" || role == "" {
				return &UsageError{Msg: "--name and --role are required"}
			}
			if !wire.ValidRole(role) {
				return &UsageError{Msg: fmt.Sprintf("unknown role %q: use one of %s", role, strings.Join(wire.Roles, ", "))}
			}
			body := map[string]json.RawMessage{"name": mustJSON(name), "role": mustJSON(role)}
			if expires != "" {
				d, err := parseLifetime(expires)
				if err != nil {
					return &UsageError{Msg: "--expires: " + err.Error()}
				}
				body["expires_in_seconds"] = mustJSON(int64(d / time.Second))
			}
			cl, err := a.Client()
			if err != nil {
				return err
			}
			resp, err := cl.Do(ctxOf(cmd), http.MethodPost, "/v0/keys", encodeOrdered(body, "name", "role", "expires_in_seconds"))
			if err != nil {
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), resp.Body)
				return nil
			}
			var k APIKey
			if err := json.Unmarshal(resp.Body, &k); err != nil {
				return err
			}
			st := a.styles
			a.errf("%s Created key %s (%s)%s. Its token, shown only now:\n", st.paint(st.ok, "✔"), st.paint(st.bold, k.Name), k.Role,
				expiryText(k.ExpiresAt, " expiring "))
			// The token alone on stdout, so that it can be piped into a secret store.
			a.printf("%s\n", k.Token)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&name, "name", "", "the key's name: the identity its decisions are recorded under")
	f.StringVar(&role, "role", "", "viewer, approver, operator or admin")
	f.StringVar(&expires, "expires", "", "lifetime, e.g. 30d, 12h (default: never)")
	return c
}

func expiryText(t *time.Time, prefix string) string {
	if t == nil {
		return ""
	}
	return prefix + t.Local().Format("2006-01-02 15:04")
}

// parseLifetime reads a Go duration, or a whole number of days ("30d").
func parseLifetime(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%q is not a number of days", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("%q is not a lifetime (use 30d, 12h or 90m)", s)
	}
	return d, nil
}

func (a *App) keysLs() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List keys: name, role, created, last used, expiry (never the token)",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			var keys []APIKey
			raw, err := cl.GetJSON(ctxOf(cmd), "/v0/keys", &keys)
			if err != nil {
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), raw)
				return nil
			}
			if len(keys) == 0 {
				if a.tty {
					a.errf("No keys. Create one with: %s\n", a.cmdline("keys create --name NAME --role viewer"))
				}
				return nil
			}
			t := &table{header: []string{"NAME", "ROLE", "CREATED", "BY", "LAST USED", "EXPIRES", "STATE"}}
			for _, k := range keys {
				state := "active"
				switch {
				case k.RevokedAt != nil:
					state = "revoked " + a.when(*k.RevokedAt)
				case k.ExpiresAt != nil && !a.now().Before(*k.ExpiresAt):
					state = "expired"
				}
				used, exp := "never", "never"
				if k.LastUsedAt != nil {
					used = a.when(*k.LastUsedAt)
				}
				if k.ExpiresAt != nil {
					exp = a.when(*k.ExpiresAt)
				}
				t.add(a.styles.paint(a.styles.bold, k.Name), k.Role, a.when(k.CreatedAt), k.CreatedBy, used, exp, state)
			}
			t.print(a.Out(), a.tty, a.styles)
			return nil
		},
	}
}

func (a *App) keysRevoke() *cobra.Command {
	return &cobra.Command{
		Use:   "revoke <name>",
		Short: "Revoke a key: it stops working on every replica within 2 s",
		Args:  exactArgs("name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			if _, err := cl.Do(ctxOf(cmd), http.MethodDelete, "/v0/keys/"+url.PathEscape(args[0]), nil); err != nil {
				var ae *APIError
				if asAPI(err, &ae) && ae.Status == 404 {
					ae.Hint = "`" + a.cmdline("keys ls") + "` lists the keys"
				}
				return err
			}
			if !a.json {
				a.printf("%s Revoked key %s\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.bold, args[0]))
			}
			return nil
		},
	}
}

func (a *App) auditCommand() *cobra.Command {
	var after int64
	var limit int
	c := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: keys created and revoked, approvals decided, and by whom",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			var entries []AuditEntry
			raw, err := cl.GetJSON(ctxOf(cmd), fmt.Sprintf("/v0/audit?after=%d&limit=%d", after, limit), &entries)
			if err != nil {
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), raw)
				return nil
			}
			t := &table{header: []string{"SEQ", "AT", "ACTOR", "ACTION", "SUBJECT", "DETAIL"}}
			for _, e := range entries {
				t.add(strconv.FormatInt(e.Seq, 10), a.when(e.At), a.styles.paint(a.styles.bold, e.Actor), e.Action, e.Subject, string(e.Detail))
			}
			t.print(a.Out(), a.tty, a.styles)
			return nil
		},
	}
	c.Flags().Int64Var(&after, "after", 0, "show entries after this seq")
	c.Flags().IntVar(&limit, "limit", 1000, "entries to show (at most 1000)")
	return c
}
