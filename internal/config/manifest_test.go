package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func mapLookup(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

var testEnv = map[string]string{
	"A":      "va",
	"A_B":    "vab",
	"B":      "vb",
	"EMPTY":  "",
	"DOLLAR": "$A", // a value is not expanded again
	"SECRET": "s3cr3t-value",
	"_X1":    "x1",
}

func TestExpandEnv(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "", want: ""},
		{in: "plain", want: "plain"},
		{in: "${A}", want: "va"},
		{in: "$A", want: "va"},
		{in: "$A_B-c", want: "vab-c"},
		{in: "${A}_B", want: "va_B"},
		{in: "$_X1.", want: "x1."},
		{in: "$$", want: "$"},
		{in: "$$A", want: "$A"},
		{in: "$$$A", want: "$va"},
		{in: "$$$$", want: "$$"},
		{in: "$5", want: "$5"},
		{in: "cost $5", want: "cost $5"},
		{in: "a$ b", want: "a$ b"},
		{in: "trailing $", want: "trailing $"},
		{in: "$", want: "$"},
		{in: "$-x", want: "$-x"},
		{in: "$}", want: "$}"},
		{in: "é$A€", want: "éva€"},
		{in: "$EMPTY", want: ""},
		{in: "x${EMPTY}y", want: "xy"},
		{in: "$DOLLAR", want: "$A"},
		{in: "$A/$B/${A_B}", want: "va/vb/vab"},
		{in: "${A}${B}", want: "vavb"},
		{in: "line1 $A\nline2 ${B}\n", want: "line1 va\nline2 vb\n"},
		{in: "${}", wantErr: `"${" at byte 0 must be followed by a variable name and "}"`},
		{in: "ab${A", wantErr: `"${" at byte 2 must be followed by a variable name and "}"`},
		{in: "${", wantErr: `"${" at byte 0`},
		{in: "${A-B}", wantErr: `"${" at byte 0`},
		{in: "${5}", wantErr: `"${" at byte 0`},
		{in: "${ A}", wantErr: `"${" at byte 0`},
		{in: "$$${", wantErr: `"${" at byte 2`},
		{in: "$UNSET", wantErr: "environment variable UNSET is not set"},
		{in: "${UNSET}", wantErr: "environment variable UNSET is not set"},
		{in: "$A $UNSET_2x", wantErr: "environment variable UNSET_2x is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := expandEnv(tt.in, mapLookup(testEnv))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("expandEnv(%q) = %q, want error containing %q", tt.in, got, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("expandEnv(%q) error = %q, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("expandEnv(%q) error: %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("expandEnv(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseManifest(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    []ManifestAgent
		wantErr string // exact message when it starts with "manifest", else a substring
	}{
		{name: "empty file", yaml: ""},
		{name: "comments only", yaml: "# nothing here\n"},
		{name: "empty document", yaml: "---\n"},
		{name: "empty list", yaml: "agents: []\n"},
		{name: "null list", yaml: "agents:\n# - id: later\n"},
		{name: "no agents key", yaml: "{}\n"},
		{
			name: "full agent with inline policy",
			yaml: `agents:
  - id: researcher
    webhook_url: http://localhost:5000/webhook
    secret: ${SECRET}
    lease_timeout_seconds: 300
    policy: |
      default_action: deny
`,
			want: []ManifestAgent{{
				ID: "researcher", WebhookURL: "http://localhost:5000/webhook", Secret: "s3cr3t-value",
				LeaseTimeoutSeconds: 300, Policy: "default_action: deny\n", HasPolicy: true, Line: 2,
			}},
		},
		{
			name: "no policy and no lease",
			yaml: `agents:
- id: a
  webhook_url: http://h/
  secret: k
- {id: b, webhook_url: "http://h/$A", secret: 'x$$y'}
`,
			want: []ManifestAgent{
				{ID: "a", WebhookURL: "http://h/", Secret: "k", Line: 2},
				{ID: "b", WebhookURL: "http://h/va", Secret: "x$y", Line: 5},
			},
		},
		{
			name: "explicit empty policy",
			yaml: `agents:
  - id: a
    webhook_url: http://h/
    secret: k
    policy: ""
`,
			want: []ManifestAgent{{ID: "a", WebhookURL: "http://h/", Secret: "k", HasPolicy: true, Line: 2}},
		},
		{
			name: "policy expanding to empty",
			yaml: `agents:
  - id: a
    webhook_url: http://h/
    secret: k
    policy: $EMPTY
`,
			want: []ManifestAgent{{ID: "a", WebhookURL: "http://h/", Secret: "k", HasPolicy: true, Line: 2}},
		},
		{
			name: "expansion inside multi-line inline policy",
			yaml: `agents:
  - id: a
    webhook_url: http://h/
    secret: k
    policy: |
      default_action: deny
      rules:
        - id: r1
          when: {tool: "$A"}
          note: "costs $5, or $$10"
          url: ${B}/x
`,
			want: []ManifestAgent{{
				ID: "a", WebhookURL: "http://h/", Secret: "k", HasPolicy: true, Line: 2,
				Policy: "default_action: deny\nrules:\n  - id: r1\n    when: {tool: \"va\"}\n    note: \"costs $5, or $10\"\n    url: vb/x\n",
			}},
		},
		{
			name: "values from anchors",
			yaml: `agents:
  - id: a
    webhook_url: &url http://h/
    secret: k
  - id: b
    webhook_url: *url
    secret: k
`,
			want: []ManifestAgent{
				{ID: "a", WebhookURL: "http://h/", Secret: "k", Line: 2},
				{ID: "b", WebhookURL: "http://h/", Secret: "k", Line: 5},
			},
		},
		{
			name: "lease in hex and negative (range is the kernel's job)",
			yaml: `agents:
  - {id: a, webhook_url: u, secret: k, lease_timeout_seconds: 0x10}
  - {id: b, webhook_url: u, secret: k, lease_timeout_seconds: -5}
`,
			want: []ManifestAgent{
				{ID: "a", WebhookURL: "u", Secret: "k", LeaseTimeoutSeconds: 16, Line: 2},
				{ID: "b", WebhookURL: "u", Secret: "k", LeaseTimeoutSeconds: -5, Line: 3},
			},
		},
		{
			name: "keys are not expanded",
			yaml: `agents:
  - id: a
    webhook_url: u
    secret: k
    $A: x
`,
			wantErr: "manifest line 5: agents[0].$A: unknown key",
		},

		// Structure.
		{
			name: "unknown agent key",
			yaml: `agents:
  - id: a
    webhook_url: http://h/
    secret: k
  - id: b
    secret: k
    webhook_urll: http://h/
`,
			wantErr: "manifest line 7: agents[1].webhook_urll: unknown key",
		},
		{
			name: "unknown top-level key",
			yaml: `# comment
agents: []
kernel:
  port: 1
`,
			wantErr: "manifest line 3: kernel: unknown key",
		},
		{
			name:    "top level not a mapping",
			yaml:    "- id: a\n",
			wantErr: `manifest line 1: the top level must be a mapping with the key "agents"`,
		},
		{
			name:    "agents not a sequence",
			yaml:    "agents:\n  id: a\n",
			wantErr: "manifest line 2: agents: must be a sequence of mappings",
		},
		{
			name:    "agents is a string",
			yaml:    "agents: none\n",
			wantErr: "manifest line 1: agents: must be a sequence of mappings",
		},
		{
			name:    "agent not a mapping",
			yaml:    "agents:\n  - {id: a, webhook_url: u, secret: k}\n  - researcher\n",
			wantErr: "manifest line 3: agents[1]: must be a mapping",
		},
		{
			name:    "duplicate top-level key",
			yaml:    "agents: []\nagents: []\n",
			wantErr: "manifest line 2: agents: duplicate key (first at line 1)",
		},
		{
			name: "duplicate agent key",
			yaml: `agents:
  - id: a
    webhook_url: u
    secret: k
    secret: k2
`,
			wantErr: "manifest line 5: agents[0].secret: duplicate key (first at line 4)",
		},
		{
			name: "two documents",
			yaml: `agents: []
---
agents: []
`,
			wantErr: "manifest line 2: more than one YAML document",
		},
		{
			name:    "two empty documents",
			yaml:    "---\n---\n",
			wantErr: "more than one YAML document",
		},
		{
			name:    "second document malformed",
			yaml:    "agents: []\n---\nagents: [\n",
			wantErr: "manifest line 4: invalid YAML: did not find expected node content",
		},
		{
			name:    "syntax error",
			yaml:    "agents: [\n",
			wantErr: "manifest line 2: invalid YAML: did not find expected node content",
		},
		{
			name:    "non-scalar key",
			yaml:    "agents:\n  - ? [a]\n    : x\n",
			wantErr: "manifest line 2: agents[0]: mapping keys must be strings, got a list",
		},

		// Required fields.
		{
			name:    "missing id",
			yaml:    "agents:\n  - webhook_url: u\n    secret: k\n",
			wantErr: "manifest line 2: agents[0].id: missing required key",
		},
		{
			name:    "missing webhook_url",
			yaml:    "agents:\n  - id: a\n    secret: k\n",
			wantErr: "manifest line 2: agents[0].webhook_url: missing required key",
		},
		{
			name:    "missing secret",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n",
			wantErr: "manifest line 2: agents[0].secret: missing required key",
		},
		{
			name:    "empty id",
			yaml:    "agents:\n  - id: ''\n    webhook_url: u\n    secret: k\n",
			wantErr: "manifest line 2: agents[0].id: must not be empty",
		},
		{
			name:    "empty webhook_url",
			yaml:    "agents:\n  - id: a\n    webhook_url: \"\"\n    secret: k\n",
			wantErr: "manifest line 3: agents[0].webhook_url: must not be empty",
		},
		{
			name:    "secret expanding to empty",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: ${EMPTY}\n",
			wantErr: "manifest line 4: agents[0].secret: must not be empty",
		},
		{
			name:    "null secret",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret:\n",
			wantErr: "manifest line 4: agents[0].secret: must be a string, got !!null (quote the value)",
		},
		{
			name:    "numeric id",
			yaml:    "agents:\n  - id: 42\n    webhook_url: u\n    secret: k\n",
			wantErr: "manifest line 2: agents[0].id: must be a string, got !!int (quote the value)",
		},
		{
			name:    "mapping as secret",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: {v: k}\n",
			wantErr: "manifest line 4: agents[0].secret: must be a string, got a mapping",
		},
		{
			name: "duplicate id",
			yaml: `agents:
  - {id: a, webhook_url: u, secret: k}
  - {id: b, webhook_url: u, secret: k}
  - id: a
    webhook_url: u
    secret: k
`,
			wantErr: `manifest line 4: agents[2].id: duplicate id "a" (already used by agents[0] at line 2)`,
		},
		{
			name: "duplicate id after expansion",
			yaml: `agents:
  - {id: va, webhook_url: u, secret: k}
  - {id: $A, webhook_url: u, secret: k}
`,
			wantErr: `manifest line 3: agents[1].id: duplicate id "va" (already used by agents[0] at line 2)`,
		},

		// lease_timeout_seconds.
		{
			name:    "lease as string",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n    lease_timeout_seconds: \"300\"\n",
			wantErr: "manifest line 5: agents[0].lease_timeout_seconds: must be an integer, got a string",
		},
		{
			name:    "lease as float",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n    lease_timeout_seconds: 300.0\n",
			wantErr: "manifest line 5: agents[0].lease_timeout_seconds: must be an integer, got a float",
		},
		{
			name:    "lease with variable",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n    lease_timeout_seconds: $A\n",
			wantErr: "manifest line 5: agents[0].lease_timeout_seconds: must be an integer, got a string",
		},
		{
			name:    "lease null",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n    lease_timeout_seconds:\n",
			wantErr: "manifest line 5: agents[0].lease_timeout_seconds: must be an integer, got null",
		},
		{
			name:    "lease too large",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n    lease_timeout_seconds: 18446744073709551615\n",
			wantErr: "manifest line 5: agents[0].lease_timeout_seconds: integer does not fit in 64 bits",
		},

		// Policy.
		{
			name: "both policy and policy_file",
			yaml: `agents:
  - id: a
    webhook_url: u
    secret: k
    policy: "default_action: deny"
    policy_file: p.yaml
`,
			wantErr: "manifest line 6: agents[0].policy_file: cannot be combined with policy (line 5); give one or the other",
		},
		{
			name:    "policy not a string",
			yaml:    "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n    policy: {default_action: deny}\n",
			wantErr: "manifest line 5: agents[0].policy: must be a string, got a mapping",
		},

		// Expansion errors carry line and key path.
		{
			name:    "unset variable",
			yaml:    "agents:\n  - id: researcher\n    webhook_url: u\n    secret: ${RESEARCHER_SECRET}\n",
			wantErr: "manifest line 4: agents[0].secret: environment variable RESEARCHER_SECRET is not set",
		},
		{
			name:    "unset variable in url",
			yaml:    "agents:\n  - id: a\n    webhook_url: http://$HOST/x\n    secret: k\n",
			wantErr: "manifest line 3: agents[0].webhook_url: environment variable HOST is not set",
		},
		{
			name:    "bad brace in id",
			yaml:    "agents:\n  - id: a${\n    webhook_url: u\n    secret: k\n",
			wantErr: `manifest line 2: agents[0].id: "${" at byte 1 must be followed by a variable name and "}" (write "$$" for a literal "$")`,
		},
		{
			name: "unset variable in inline policy",
			yaml: `agents:
  - id: a
    webhook_url: u
    secret: k
    policy: |
      default_action: deny
      x: $NOPE
`,
			wantErr: "manifest line 5: agents[0].policy: environment variable NOPE is not set",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseManifest([]byte(tt.yaml), t.TempDir(), mapLookup(testEnv))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("got %+v, want error %q", got, tt.wantErr)
				}
				if strings.HasPrefix(tt.wantErr, "manifest") && !strings.HasPrefix(tt.wantErr, "manifest:") {
					if err.Error() != tt.wantErr {
						t.Fatalf("error = %q\n     want %q", err, tt.wantErr)
					}
				} else if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %q, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseManifestPolicyFile(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	// The contents hold `$` sequences that would fail or change under
	// expansion, proving the file is taken verbatim.
	const bundle = "default_action: deny\nnote: ${NOPE} $UNSET $$\n"
	writeFile(t, filepath.Join(dir, "policies", "researcher.yaml"), bundle)
	writeFile(t, filepath.Join(other, "abs.yaml"), "default_action: allow\n")
	writeFile(t, filepath.Join(dir, "empty.yaml"), "")

	env := map[string]string{"POLDIR": "policies", "OTHER": other}
	agent := func(extra string) string {
		return "agents:\n  - id: a\n    webhook_url: u\n    secret: k\n" + extra
	}
	tests := []struct {
		name       string
		yaml       string
		wantPolicy string
		wantErr    string
	}{
		{name: "relative to dir", yaml: agent("    policy_file: policies/researcher.yaml\n"), wantPolicy: bundle},
		{name: "dot-relative", yaml: agent("    policy_file: ./policies/../policies/researcher.yaml\n"), wantPolicy: bundle},
		{name: "expanded path", yaml: agent("    policy_file: ${POLDIR}/researcher.yaml\n"), wantPolicy: bundle},
		{name: "absolute", yaml: agent("    policy_file: " + filepath.Join(other, "abs.yaml") + "\n"), wantPolicy: "default_action: allow\n"},
		{name: "absolute via variable", yaml: agent("    policy_file: $OTHER/abs.yaml\n"), wantPolicy: "default_action: allow\n"},
		{name: "empty file", yaml: agent("    policy_file: empty.yaml\n"), wantPolicy: ""},
		{
			name:    "missing file",
			yaml:    agent("    policy_file: policies/missing.yaml\n"),
			wantErr: `manifest line 5: agents[0].policy_file: cannot read policy file "` + filepath.Join(dir, "policies", "missing.yaml") + `": no such file or directory`,
		},
		{
			name:    "directory",
			yaml:    agent("    policy_file: policies\n"),
			wantErr: `manifest line 5: agents[0].policy_file: cannot read policy file "` + filepath.Join(dir, "policies") + `"`,
		},
		{
			name:    "unset variable in path",
			yaml:    agent("    policy_file: $POLICY_DIR/x.yaml\n"),
			wantErr: "manifest line 5: agents[0].policy_file: environment variable POLICY_DIR is not set",
		},
		{
			name:    "empty path",
			yaml:    agent("    policy_file: ''\n"),
			wantErr: "manifest line 5: agents[0].policy_file: must not be empty",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseManifest([]byte(tt.yaml), dir, mapLookup(env))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("got %+v, want error %q", got, tt.wantErr)
				}
				if !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("error = %q\nwant prefix %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if len(got) != 1 || !got[0].HasPolicy || got[0].Policy != tt.wantPolicy {
				t.Fatalf("got %+v, want one agent with policy %q", got, tt.wantPolicy)
			}
		})
	}
}

func TestLoadManifest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "conf")
	writeFile(t, filepath.Join(dir, "policies", "r.yaml"), "default_action: deny\n")
	manifest := filepath.Join(dir, "rebuno.yaml")
	writeFile(t, manifest, `agents:
  - id: researcher
    webhook_url: http://localhost:5000/webhook
    secret: ${RESEARCHER_SECRET}
    policy_file: policies/r.yaml
`)
	// Relative paths must resolve against the manifest, not the working
	// directory, so run from somewhere else.
	t.Chdir(t.TempDir())

	tests := []struct {
		name    string
		path    string
		env     map[string]string
		want    []ManifestAgent
		wantErr string
	}{
		{
			name: "ok",
			path: manifest,
			env:  map[string]string{"RESEARCHER_SECRET": "0123456789abcdef"},
			want: []ManifestAgent{{
				ID: "researcher", WebhookURL: "http://localhost:5000/webhook", Secret: "0123456789abcdef",
				Policy: "default_action: deny\n", HasPolicy: true, Line: 2,
			}},
		},
		{
			name:    "unset secret",
			path:    manifest,
			env:     map[string]string{},
			wantErr: "manifest line 4: agents[0].secret: environment variable RESEARCHER_SECRET is not set",
		},
		{
			name:    "missing manifest",
			path:    filepath.Join(dir, "nope.yaml"),
			wantErr: "manifest: open " + filepath.Join(dir, "nope.yaml") + ": no such file or directory",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LoadManifest(tt.path, mapLookup(tt.env))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestErrorsDoNotRevealSecrets covers every way a secret's value could reach
// an error: malformed expansion, wrong type, and a later error in the same
// agent or manifest.
func TestErrorsDoNotRevealSecrets(t *testing.T) {
	const secret = "hunter2-very-secret"
	env := map[string]string{"S": secret}
	tests := []struct {
		name string
		yaml string
	}{
		{name: "bad brace", yaml: "agents:\n  - id: a\n    webhook_url: u\n    secret: " + secret + "${\n"},
		{name: "bad brace name", yaml: "agents:\n  - id: a\n    webhook_url: u\n    secret: \"${" + secret + "}\"\n"},
		{name: "duplicate key", yaml: "agents:\n  - id: a\n    webhook_url: u\n    secret: " + secret + "\n    secret: " + secret + "\n"},
		{name: "later error", yaml: "agents:\n  - id: a\n    webhook_url: u\n    secret: $S\n    lease_timeout_seconds: x\n"},
		{name: "duplicate id", yaml: "agents:\n  - {id: a, webhook_url: u, secret: $S}\n  - {id: a, webhook_url: u, secret: $S}\n"},
		{name: "secret in wrong type", yaml: "agents:\n  - id: a\n    webhook_url: u\n    secret: [" + secret + "]\n"},
		{name: "tagged secret", yaml: "agents:\n  - id: a\n    webhook_url: u\n    secret: !custom " + secret + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(tt.yaml), "", mapLookup(env))
			if err == nil {
				t.Fatal("want an error")
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error reveals the secret: %v", err)
			}
		})
	}
}
