package cli

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/config"
	"github.com/rebuno/rebuno/internal/wire"
)

// EnvAgentSecret is read by `agent add` when --secret is not given.
const EnvAgentSecret = "REBUNO_AGENT_SECRET"

func (a *App) agentCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "agent <command>",
		Aliases: []string{"agents"},
		Short:   "Register, list, inspect and remove agents",
		Example: "  rebuno agent add --id researcher --webhook-url http://127.0.0.1:5000/webhook --secret \"$SECRET\"\n" +
			"  rebuno agent add agents.yaml\n" +
			"  rebuno agent ls\n" +
			"  rebuno agent rm researcher",
	}
	c.AddCommand(a.agentLs(), a.agentGet(), a.agentAdd(), a.agentRm())
	return c
}

func (a *App) agentLs() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the registered agents",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			var agents []Agent
			raw, err := cl.GetJSON(ctxOf(cmd), "/v0/agents", &agents)
			if err != nil {
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), raw)
				return nil
			}
			if len(agents) == 0 {
				if a.tty {
					a.errf("No agents registered. Register one with: %s\n", a.cmdline("agent add --id ID --webhook-url URL --secret S"))
				}
				return nil
			}
			t := &table{header: []string{"ID", "WEBHOOK", "POLICY", "LEASE", "UPDATED"}}
			for _, ag := range agents {
				t.add(a.styles.paint(a.styles.bold, ag.ID), ag.WebhookURL, policySummary(ag.PolicyBundle), leaseText(ag.LeaseTimeoutSeconds), a.when(ag.UpdatedAt))
			}
			t.print(a.Out(), a.tty, a.styles)
			return nil
		},
	}
}

func policySummary(bundle string) string {
	if strings.TrimSpace(bundle) == "" {
		return "none"
	}
	n := strings.Count(strings.TrimRight(bundle, "\n"), "\n") + 1
	return fmt.Sprintf("%d line%s", n, plural(n))
}

func leaseText(s *int64) string {
	if s == nil {
		return "default"
	}
	return strconv.FormatInt(*s, 10) + "s"
}

func (a *App) agentGet() *cobra.Command {
	return &cobra.Command{
		Use:   "get <id>",
		Short: "Show an agent: webhook, registration time and policy bundle",
		Args:  exactArgs("id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			var ag Agent
			raw, err := cl.GetJSON(ctxOf(cmd), "/v0/agents/"+url.PathEscape(args[0]), &ag)
			if err != nil {
				var ae *APIError
				if asAPI(err, &ae) && ae.Status == 404 {
					ae.Hint = "`" + a.cmdline("agent ls") + "` lists the registered agents"
				}
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), raw)
				return nil
			}
			st := a.styles
			a.printf("%s %s\n", st.paint(st.bold, "agent"), st.paint(st.bold, ag.ID))
			row := func(k, v string) {
				if strings.HasPrefix(v, "\n") {
					a.printf("  %s%s\n", st.paint(st.key, k), v)
				} else if v != "" {
					a.printf("  %s %s\n", st.paint(st.key, fmt.Sprintf("%-13s", k)), v)
				}
			}
			row("webhook", ag.WebhookURL)
			row("lease", leaseText(ag.LeaseTimeoutSeconds))
			row("registered", a.when(ag.RegisteredAt))
			row("updated", a.when(ag.UpdatedAt))
			row("description", ag.Description)
			if len(ag.InputSchema) > 0 {
				row("input schema", prettyJSON(ag.InputSchema, a.width-15))
			}
			if len(ag.OutputSchema) > 0 {
				row("output schema", prettyJSON(ag.OutputSchema, a.width-15))
			}
			if strings.TrimSpace(ag.PolicyBundle) == "" {
				row("policy", "none (every step is allowed)")
				return nil
			}
			a.printf("  %s\n", st.paint(st.key, "policy"))
			for _, line := range strings.Split(strings.TrimRight(ag.PolicyBundle, "\n"), "\n") {
				a.printf("    %s\n", line)
			}
			return nil
		},
	}
}

func (a *App) agentAdd() *cobra.Command {
	var id, webhook, secret, policyFile string
	var lease int64
	c := &cobra.Command{
		Use:   "add [manifest.yaml]",
		Short: "Register or update agents (from a manifest, or from flags)",
		Long: "Register an agent, or update its webhook URL, secret and lease timeout.\n\n" +
			"Either give a provisioning manifest (the same file as `rebuno dev --config`), or\n" +
			"--id, --webhook-url and --secret (default $" + EnvAgentSecret + "). A policy given by\n" +
			"--policy-file or the manifest replaces the agent's bundle; without one the existing\n" +
			"bundle is kept. Bundles are validated by the kernel before anything is written.",
		Example: "  rebuno agent add --id researcher --webhook-url http://127.0.0.1:5000/webhook --secret \"$SECRET\"\n" +
			"  rebuno agent add agents.yaml",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef(cmd, "%s takes at most one manifest file, got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var specs []config.ManifestAgent
			flagsUsed := id != "" || webhook != "" || secret != "" || policyFile != "" || lease != 0
			switch {
			case len(args) == 1 && flagsUsed:
				return usagef(cmd, "give either a manifest file or --id/--webhook-url/--secret, not both")
			case len(args) == 1:
				var err error
				specs, err = config.LoadManifest(args[0], os.LookupEnv)
				if err != nil {
					return usagef(cmd, "%s: %v", args[0], err)
				}
				if len(specs) == 0 {
					return usagef(cmd, "%s lists no agents", args[0])
				}
			default:
				if secret == "" {
					secret = a.opt.Getenv(EnvAgentSecret)
				}
				var missing []string
				if id == "" {
					missing = append(missing, "--id")
				}
				if webhook == "" {
					missing = append(missing, "--webhook-url")
				}
				if secret == "" {
					missing = append(missing, "--secret (or $"+EnvAgentSecret+")")
				}
				if len(missing) > 0 {
					return usagef(cmd, "missing %s (or give a manifest file)", strings.Join(missing, ", "))
				}
				if lease < 0 {
					return usagef(cmd, "invalid --lease-timeout %d: seconds, at least 1", lease)
				}
				spec := config.ManifestAgent{ID: id, WebhookURL: webhook, Secret: secret, LeaseTimeoutSeconds: lease}
				if policyFile != "" {
					b, err := os.ReadFile(policyFile)
					if err != nil {
						return usagef(cmd, "read --policy-file: %v", err)
					}
					spec.Policy, spec.HasPolicy = string(b), true
				}
				specs = []config.ManifestAgent{spec}
			}
			return a.addAgents(cmd, specs)
		},
	}
	f := c.Flags()
	f.StringVar(&id, "id", "", "agent id")
	f.StringVar(&webhook, "webhook-url", "", "URL the kernel delivers webhooks to")
	f.StringVar(&secret, "secret", "", "shared secret for signatures (default $"+EnvAgentSecret+")")
	f.StringVar(&policyFile, "policy-file", "", "policy bundle (YAML) to load for the agent")
	f.Int64Var(&lease, "lease-timeout", 0, "lease of the agent's dispatches in seconds (default: the kernel's)")
	return c
}

func (a *App) addAgents(cmd *cobra.Command, specs []config.ManifestAgent) error {
	cl, err := a.Client()
	if err != nil {
		return err
	}
	ctx := ctxOf(cmd)
	// Validate every bundle first, so that a bad one writes nothing. The
	// policy route validates before it looks the agent up (docs/protocol/governance.md §4.3), so a
	// probe id that names no agent answers 404 for a valid bundle.
	probe := "rebuno-cli-check-" + randomHex(8)
	for _, s := range specs {
		if !s.HasPolicy || s.Policy == "" {
			continue
		}
		_, err := cl.Do(ctx, http.MethodPost, "/v0/policies/"+probe, encodeOrdered(map[string]json.RawMessage{"bundle": mustJSON(s.Policy)}, "bundle"))
		var ae *APIError
		switch {
		case err == nil:
			// A probe agent exists after all: the bundle was valid; remove the
			// stray policy so nothing changed.
			cl.Do(ctx, http.MethodPost, "/v0/policies/"+probe, []byte(`{}`))
		case asAPI(err, &ae) && ae.Status == 404:
		case asAPI(err, &ae) && ae.Status == 400:
			ae.Hint = "the policy of agent " + s.ID + " is invalid; nothing was registered"
			return ae
		default:
			return err
		}
	}
	for _, s := range specs {
		body := map[string]json.RawMessage{"id": mustJSON(s.ID), "webhook_url": mustJSON(s.WebhookURL), "secret": mustJSON(s.Secret)}
		if s.LeaseTimeoutSeconds > 0 {
			body["lease_timeout_seconds"] = mustJSON(s.LeaseTimeoutSeconds)
		}
		if _, err := cl.Do(ctx, http.MethodPost, "/v0/agents", encodeOrdered(body, "id", "webhook_url", "secret", "lease_timeout_seconds")); err != nil {
			return err
		}
		policy := "kept"
		if s.HasPolicy {
			if _, err := cl.Do(ctx, http.MethodPost, "/v0/policies/"+url.PathEscape(s.ID),
				encodeOrdered(map[string]json.RawMessage{"bundle": mustJSON(s.Policy)}, "bundle")); err != nil {
				return err
			}
			policy = "set"
			if s.Policy == "" {
				policy = "removed"
			}
		}
		switch {
		case a.json:
			raw, err := cl.GetJSON(ctx, "/v0/agents/"+url.PathEscape(s.ID), nil)
			if err != nil {
				return err
			}
			writeJSONLine(a.Out(), raw)
		case a.tty:
			a.printf("%s Registered agent %s → %s %s\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.bold, s.ID), wire.RedactURL(s.WebhookURL),
				a.styles.paint(a.styles.dim, "(policy "+policy+")"))
		default:
			a.printf("registered %s (policy %s)\n", s.ID, policy)
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (a *App) agentRm() *cobra.Command {
	return &cobra.Command{
		Use:     "rm <id>",
		Aliases: []string{"delete"},
		Short:   "Remove an agent (its finished executions stay readable)",
		Args:    exactArgs("id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			if _, err := cl.Do(ctxOf(cmd), http.MethodDelete, "/v0/agents/"+url.PathEscape(args[0]), nil); err != nil {
				var ae *APIError
				if asAPI(err, &ae) {
					switch ae.Status {
					case 404:
						ae.Hint = "`" + a.cmdline("agent ls") + "` lists the registered agents"
					case 409:
						ae.Hint = "the agent has executions that have not ended; cancel them first " +
							"(" + a.cmdline("exec ls --agent "+args[0]) + ")"
					}
				}
				return err
			}
			switch {
			case a.json:
			case a.tty:
				a.printf("%s Removed agent %s\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.bold, args[0]))
			default:
				a.printf("removed %s\n", args[0])
			}
			return nil
		},
	}
}
