// Package config reads the kernel's start-up configuration files.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/rebuno/rebuno/internal/yamlx"
)

// ManifestAgent is one agent of a provisioning manifest, after environment expansion.
type ManifestAgent struct {
	ID                  string
	WebhookURL          string
	Secret              string
	LeaseTimeoutSeconds int64  // 0 when absent
	Policy              string // the bundle text (inline `policy`, or the contents of `policy_file`)
	HasPolicy           bool   // true when `policy` or `policy_file` was given (an explicit `policy: ""` is HasPolicy with Policy "")
	Line                int    // line of the agent's entry in the manifest, for messages
}

// Manifest keys. Field rules beyond presence and type (docs/protocol/governance.md §4.2) are left to the
// kernel so that the manifest and the HTTP API cannot disagree about them.
const (
	keyAgents     = "agents"
	keyID         = "id"
	keyWebhookURL = "webhook_url"
	keySecret     = "secret"
	keyLease      = "lease_timeout_seconds"
	keyPolicy     = "policy"
	keyPolicyFile = "policy_file"
	yamlTagStr    = "!!str"
	yamlTagInt    = "!!int"
)

var agentKeys = map[string]bool{
	keyID: true, keyWebhookURL: true, keySecret: true,
	keyLease: true, keyPolicy: true, keyPolicyFile: true,
}

// manifestError carries the position of a problem. Messages never quote a
// value other than an agent id, so a secret cannot leak into logs.
type manifestError struct {
	line int
	path string
	msg  string
}

func (e *manifestError) Error() string {
	if e.path == "" {
		return fmt.Sprintf("manifest line %d: %s", e.line, e.msg)
	}
	return fmt.Sprintf("manifest line %d: %s: %s", e.line, e.path, e.msg)
}

func errAt(line int, path, format string, args ...any) error {
	return &manifestError{line: line, path: path, msg: fmt.Sprintf(format, args...)}
}

// LoadManifest reads and parses the manifest at path. lookup resolves
// environment variables (os.LookupEnv in production, a map in tests).
func LoadManifest(path string, lookup func(string) (string, bool)) ([]ManifestAgent, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return ParseManifest(data, filepath.Dir(path), lookup)
}

// ParseManifest parses manifest bytes; dir is the directory relative
// `policy_file` paths resolve against.
func ParseManifest(data []byte, dir string, lookup func(string) (string, bool)) ([]ManifestAgent, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	// The Node API is used instead of decoding into a struct because the
	// messages need lines and key paths, and because yaml's own strictness
	// (KnownFields, duplicate-key checks) applies only to typed decoding.
	doc, yerr := yamlx.Document(string(data))
	if yerr != nil {
		return nil, errAt(yerr.Line, yerr.Path, "%s", yerr.Problem)
	}
	root := yamlx.Root(doc)
	if root == nil {
		return nil, nil
	}
	if errs := yamlx.Check(root); len(errs) > 0 {
		return nil, errAt(errs[0].Line, errs[0].Path, "%s", errs[0].Problem)
	}
	root = yamlx.Deref(root)
	if yamlx.IsNull(root) {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, errAt(root.Line, "", "the top level must be a mapping with the key %q", keyAgents)
	}
	fields, err := mappingFields(root, "", func(k string) bool { return k == keyAgents })
	if err != nil {
		return nil, err
	}
	agentsNode, ok := fields[keyAgents]
	if !ok {
		return nil, nil
	}
	seq := agentsNode.value
	// `agents:` with every entry commented out is null; reading it as an
	// empty list matches what an empty file means.
	if yamlx.IsNull(seq) {
		return nil, nil
	}
	if seq.Kind != yaml.SequenceNode {
		return nil, errAt(seq.Line, keyAgents, "must be a sequence of mappings")
	}

	p := parser{dir: dir, lookup: lookup, ids: map[string]idSeen{}}
	agents := make([]ManifestAgent, 0, len(seq.Content))
	for i, item := range seq.Content {
		a, err := p.agent(item, fmt.Sprintf("%s[%d]", keyAgents, i))
		if err != nil {
			return nil, err
		}
		agents = append(agents, a)
	}
	return agents, nil
}

type idSeen struct {
	path string
	line int
}

type parser struct {
	dir    string
	lookup func(string) (string, bool)
	ids    map[string]idSeen
}

// field is one key of a mapping with its (alias-resolved) value.
type field struct {
	keyLine int
	value   *yaml.Node
}

func (p *parser) agent(item *yaml.Node, path string) (ManifestAgent, error) {
	node := yamlx.Deref(item)
	if node.Kind != yaml.MappingNode {
		return ManifestAgent{}, errAt(node.Line, path, "must be a mapping")
	}
	fields, err := mappingFields(node, path, func(k string) bool { return agentKeys[k] })
	if err != nil {
		return ManifestAgent{}, err
	}
	a := ManifestAgent{Line: node.Line}

	required := []struct {
		key string
		dst *string
	}{
		{keyID, &a.ID},
		{keyWebhookURL, &a.WebhookURL},
		{keySecret, &a.Secret},
	}
	for _, r := range required {
		f, ok := fields[r.key]
		if !ok {
			return ManifestAgent{}, errAt(node.Line, path+"."+r.key, "missing required key")
		}
		v, err := p.stringValue(f, path+"."+r.key)
		if err != nil {
			return ManifestAgent{}, err
		}
		// Checked after expansion: a variable set to "" must not yield an
		// agent without an id, URL or secret.
		if v == "" {
			return ManifestAgent{}, errAt(f.value.Line, path+"."+r.key, "must not be empty")
		}
		*r.dst = v
	}

	if prev, dup := p.ids[a.ID]; dup {
		return ManifestAgent{}, errAt(fields[keyID].value.Line, path+"."+keyID,
			"duplicate id %q (already used by %s at line %d)", a.ID, prev.path, prev.line)
	}
	p.ids[a.ID] = idSeen{path: path, line: fields[keyID].value.Line}

	if f, ok := fields[keyLease]; ok {
		n, err := intValue(f, path+"."+keyLease)
		if err != nil {
			return ManifestAgent{}, err
		}
		a.LeaseTimeoutSeconds = n
	}

	inline, hasInline := fields[keyPolicy]
	file, hasFile := fields[keyPolicyFile]
	switch {
	case hasInline && hasFile:
		return ManifestAgent{}, errAt(file.keyLine, path+"."+keyPolicyFile,
			"cannot be combined with %s (line %d); give one or the other", keyPolicy, inline.keyLine)
	case hasInline:
		v, err := p.stringValue(inline, path+"."+keyPolicy)
		if err != nil {
			return ManifestAgent{}, err
		}
		a.Policy, a.HasPolicy = v, true
	case hasFile:
		v, err := p.policyFile(file, path+"."+keyPolicyFile)
		if err != nil {
			return ManifestAgent{}, err
		}
		a.Policy, a.HasPolicy = v, true
	}
	return a, nil
}

// policyFile expands the path (but not the contents: a bundle may legitimately
// contain `$`, and its author did not write it with manifest rules in mind).
func (p *parser) policyFile(f field, path string) (string, error) {
	name, err := p.stringValue(f, path)
	if err != nil {
		return "", err
	}
	if name == "" {
		return "", errAt(f.value.Line, path, "must not be empty")
	}
	if !filepath.IsAbs(name) {
		name = filepath.Join(p.dir, name)
	}
	data, err := os.ReadFile(name)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", errAt(f.value.Line, path, "cannot read policy file %q: %v", name, err)
	}
	return string(data), nil
}

// stringValue insists on a YAML string so that e.g. `secret: 0123` does not
// silently become something other than what was typed; quoting fixes it.
func (p *parser) stringValue(f field, path string) (string, error) {
	n := f.value
	if n.Kind != yaml.ScalarNode {
		return "", errAt(n.Line, path, "must be a string, got %s", yamlx.Describe(n))
	}
	if tag := n.ShortTag(); tag != yamlTagStr {
		return "", errAt(n.Line, path, "must be a string, got %s (quote the value)", tag)
	}
	v, err := expandEnv(n.Value, p.lookup)
	if err != nil {
		return "", errAt(n.Line, path, "%v", err)
	}
	return v, nil
}

func intValue(f field, path string) (int64, error) {
	n := f.value
	if n.Kind != yaml.ScalarNode || n.ShortTag() != yamlTagInt {
		got := yamlx.Describe(n)

		return 0, errAt(n.Line, path, "must be an integer, got %s", got)
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		return 0, errAt(n.Line, path, "integer does not fit in 64 bits")
	}
	return v, nil
}

// mappingFields indexes a mapping by key, refusing unknown keys. Repeated
// keys (a second `secret:` silently overriding the first is an easy mistake)
// were refused by yamlx.Check before.
func mappingFields(m *yaml.Node, path string, known func(string) bool) (map[string]field, error) {
	out := make(map[string]field, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := yamlx.Deref(m.Content[i])
		if k.Kind != yaml.ScalarNode {
			return nil, errAt(k.Line, path, "mapping keys must be strings, got %s", yamlx.Describe(k))
		}
		keyPath := k.Value
		if path != "" {
			keyPath = path + "." + k.Value
		}
		if !known(k.Value) {
			return nil, errAt(k.Line, keyPath, "unknown key")
		}
		out[k.Value] = field{keyLine: k.Line, value: yamlx.Deref(m.Content[i+1])}
	}
	return out, nil
}

// expandEnv implements the manifest's expansion rules. os.Expand is not used:
// it looks up `$$` and `$5` as shell special variables, accepts any text
// inside `${...}` as a name, and silently drops a malformed `${`, any of
// which could turn a typo into a guessable secret.
//
// Error messages give offsets, never fragments of s, because s may be a
// secret; the one exception is the name of an unset variable, which the
// operator needs to see.
func expandEnv(s string, lookup func(string) (string, bool)) (string, error) {
	if strings.IndexByte(s, '$') < 0 {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		j := strings.IndexByte(s[i:], '$')
		if j < 0 {
			b.WriteString(s[i:])
			break
		}
		b.WriteString(s[i : i+j])
		i += j // s[i] is '$'
		if i+1 == len(s) {
			b.WriteByte('$')
			break
		}
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i += 2
		case next == '{':
			start := i + 2
			end := scanName(s, start)
			if end == start || end >= len(s) || s[end] != '}' {
				return "", fmt.Errorf("\"${\" at byte %d must be followed by a variable name and \"}\" (write \"$$\" for a literal \"$\")", i)
			}
			v, err := lookupVar(s[start:end], lookup)
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			i = end + 1
		case isNameStart(next):
			end := scanName(s, i+1)
			v, err := lookupVar(s[i+1:end], lookup)
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			i = end
		default:
			b.WriteByte('$')
			i++
		}
	}
	return b.String(), nil
}

func lookupVar(name string, lookup func(string) (string, bool)) (string, error) {
	v, ok := lookup(name)
	if !ok {
		return "", fmt.Errorf("environment variable %s is not set", name)
	}
	return v, nil
}

// scanName returns the end of the variable name starting at s[start], or
// start when there is none.
func scanName(s string, start int) int {
	if start >= len(s) || !isNameStart(s[start]) {
		return start
	}
	i := start + 1
	for i < len(s) && (isNameStart(s[i]) || ('0' <= s[i] && s[i] <= '9')) {
		i++
	}
	return i
}

func isNameStart(c byte) bool {
	return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}
