package policy

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/rebuno/rebuno/internal/yamlx"
)

// Limits of docs/protocol/governance.md §2.3.
const (
	maxBundleBytes     = 1 << 20
	maxRules           = 10000
	maxIDBytes         = 128
	maxReasonBytes     = 1024
	maxMessageBytes    = 4096
	maxRegexBytes      = 4096
	minApprovalTimeout = time.Second
	maxApprovalTimeout = 8760 * time.Hour
)

// expansionBudget bounds the nodes the schema walk may visit. Without
// aliases a 1 MiB text holds well under a million nodes, so only alias
// expansion (one small alias repeating a large list thousands of times) can
// reach it; the budget keeps that from turning a 1 MiB bundle into minutes
// of work.
const expansionBudget = 2 << 20

// ValidationError is one reason a bundle was refused: its line (0 when the
// problem concerns the whole text), key path and problem.
type ValidationError = yamlx.Error

// Parse validates and compiles a bundle. The empty text means "no policy"
// and yields (nil, nil); any other text must hold exactly one YAML document,
// so whitespace or comments alone are refused rather than mistaken for a
// removal (docs/protocol/governance.md §2.3 rule 2: only "" removes a policy). On failure the error is
// the first *ValidationError in document order.
func Parse(text string) (*Bundle, error) {
	b, errs := compile(text)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return b, nil
}

// Check validates a bundle and returns every problem found, in document
// order, or nil when the bundle is valid (the empty text included).
func Check(text string) []*ValidationError {
	_, errs := compile(text)
	return errs
}

func compile(text string) (*Bundle, []*ValidationError) {
	if text == "" {
		return nil, nil
	}
	c := &compiler{budget: expansionBudget}
	b := c.bundle(text)
	if len(c.errs) > 0 {
		slices.SortStableFunc(c.errs, func(x, y *ValidationError) int { return cmp.Compare(x.Line, y.Line) })
		return nil, c.errs
	}
	return b, nil
}

type compiler struct {
	errs      []*ValidationError
	budget    int
	exhausted bool
	// regexps shares one compiled program among identical patterns, which
	// also keeps an aliased regex from being compiled once per use.
	regexps map[string]*regexp.Regexp
}

func (c *compiler) fail(line int, path, format string, args ...any) {
	c.errs = append(c.errs, &ValidationError{Line: line, Path: path, Problem: fmt.Sprintf(format, args...)})
}

func (c *compiler) bundle(text string) *Bundle {
	if len(text) > maxBundleBytes {
		c.fail(0, "", "bundle is %d bytes, larger than 1 MiB (%d bytes)", len(text), maxBundleBytes)
		return nil
	}
	doc, err := yamlx.Document(text)
	if err != nil {
		c.errs = append(c.errs, err)
		return nil
	}
	root := yamlx.Root(doc)
	if root == nil {
		line := 1
		if doc != nil {
			line = doc.Line
		}
		c.fail(line, "", `document is empty (send "" to remove a policy)`)
		return nil
	}
	c.errs = append(c.errs, yamlx.Check(root)...)
	return c.top(root)
}

// spend charges the expansion budget for visiting n's children.
func (c *compiler) spend(n *yaml.Node, at string) bool {
	c.budget -= len(n.Content)
	if c.budget >= 0 {
		return true
	}
	if !c.exhausted {
		c.exhausted = true
		c.fail(n.Line, at, "aliases expand the bundle beyond %d nodes", expansionBudget)
	}
	return false
}

type field struct {
	key  string
	k, v *yaml.Node
}

// fields reads a mapping with the given known keys (nil: any key) and
// reports unknown ones; ok is false only when n is not a readable mapping.
// Duplicates were reported by structure and are skipped here, so that one
// mistake yields one message.
func (c *compiler) fields(n *yaml.Node, at string, known []string) (fs []field, ok bool) {
	n = yamlx.Deref(n)
	if n.Kind != yaml.MappingNode {
		c.fail(n.Line, at, "must be a mapping, got %s", yamlx.Describe(n))
		return nil, false
	}
	if !c.spend(n, at) {
		return nil, false
	}
	fs = make([]field, 0, len(n.Content)/2)
	var seen map[string]bool
	if len(n.Content) > 16 {
		// Argument names are user-chosen and may be many.
		seen = make(map[string]bool, len(n.Content)/2)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		dk := yamlx.Deref(k)
		if dk.Kind != yaml.ScalarNode {
			c.fail(k.Line, at, "mapping keys must be strings, got %s", yamlx.Describe(dk))
			continue
		}
		if dk.Tag == "!!merge" {
			continue
		}
		key := dk.Value
		if known != nil && !slices.Contains(known, key) {
			c.fail(k.Line, yamlx.Join(at, key), "unknown key")
			continue
		}
		if seen != nil {
			if seen[key] {
				continue
			}
			seen[key] = true
		} else if slices.ContainsFunc(fs, func(f field) bool { return f.key == key }) {
			continue
		}
		fs = append(fs, field{key, k, v})
	}
	return fs, true
}

// list reads a sequence.
func (c *compiler) list(n *yaml.Node, at string) ([]*yaml.Node, bool) {
	n = yamlx.Deref(n)
	if n.Kind != yaml.SequenceNode {
		c.fail(n.Line, at, "must be a list, got %s", yamlx.Describe(n))
		return nil, false
	}
	if !c.spend(n, at) {
		return nil, false
	}
	return n.Content, true
}

// text reads a string-valued field. Any non-null scalar is accepted as its
// literal YAML text, the rule docs/protocol/governance.md §2.3 gives for predicate constraints, so that
// `agent_id: 007` means "007" and not 7; null is refused because a value
// left out by mistake must not read as the four letters "null".
func (c *compiler) text(n *yaml.Node, at string) (string, bool) {
	n = yamlx.Deref(n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		c.fail(n.Line, at, "must be a string, got %s", yamlx.Describe(n))
		return "", false
	}
	return n.Value, true
}

func (c *compiler) nonEmpty(n *yaml.Node, at string) (string, bool) {
	s, ok := c.text(n, at)
	if ok && s == "" {
		c.fail(yamlx.Deref(n).Line, at, "must not be empty")
		return "", false
	}
	return s, ok
}

func (c *compiler) oneOf(n *yaml.Node, at string, values ...string) (string, bool) {
	s, ok := c.text(n, at)
	if ok && !slices.Contains(values, s) {
		quoted := make([]string, len(values))
		for i, v := range values {
			quoted[i] = strconv.Quote(v)
		}
		c.fail(yamlx.Deref(n).Line, at, "must be one of %s, got %q", strings.Join(quoted, ", "), s)
		return "", false
	}
	return s, ok
}

// decimal is the only integer spelling accepted. yaml.v3 would also read
// `010` as octal 8 and `1_0` as 10, which no reader of a priority expects.
var decimal = regexp.MustCompile(`^[-+]?(0|[1-9][0-9]*)$`)

func (c *compiler) integer(n *yaml.Node, at string, lo, hi int64) (int64, bool) {
	n = yamlx.Deref(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" && decimal.MatchString(n.Value) {
		if v, err := strconv.ParseInt(n.Value, 10, 64); err == nil && v >= lo && v <= hi {
			return v, true
		}
	}
	what := "a decimal integer"
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		what += " (not quoted)"
	}
	if hi == math.MaxInt64 {
		c.fail(n.Line, at, "must be %s of at least %d, got %s", what, lo, shown(n))
	} else {
		c.fail(n.Line, at, "must be %s from %d to %d, got %s", what, lo, hi, shown(n))
	}
	return 0, false
}

func (c *compiler) duration(n *yaml.Node, at string) (time.Duration, bool) {
	s, ok := c.text(n, at)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		c.fail(yamlx.Deref(n).Line, at, `must be a Go duration such as "90s" or "1h30m", got %q`, s)
		return 0, false
	}
	return d, true
}

// shown quotes a scalar for a message, or describes a collection.
func shown(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return strconv.Quote(n.Value)
	}
	return yamlx.Describe(n)
}

var (
	topKeys       = []string{"default_action", "rules"}
	ruleKeys      = []string{"id", "priority", "when", "then"}
	whenKeys      = []string{"target", "targets", "agent_id", "agent_ids", "step_kind", "arguments"}
	predicateKeys = []string{"equals", "contains", "one_of", "regex"}
	thenKeys      = []string{"decision", "reason", "approval_config", "rate_limit"}
	approvalKeys  = []string{"approvers", "timeout", "message"}
	rateLimitKeys = []string{"max_calls", "window", "per_what", "on_limiter_error"}
)

func (c *compiler) top(root *yaml.Node) *Bundle {
	if root.Kind != yaml.MappingNode {
		c.fail(root.Line, "", "the top level must be a mapping, got %s", yamlx.Describe(root))
		return nil
	}
	fs, _ := c.fields(root, "", topKeys)
	b := &Bundle{DefaultAction: Deny}
	for _, f := range fs {
		switch f.key {
		case "default_action":
			if s, ok := c.oneOf(f.v, f.key, Allow, Deny); ok {
				b.DefaultAction = s
			}
		case "rules":
			b.Rules = c.rules(f.v, f.key)
		}
	}
	// Priorities are unique, so the order is total and the sort need not
	// be stable.
	slices.SortFunc(b.Rules, func(x, y Rule) int { return cmp.Compare(x.Priority, y.Priority) })
	return b
}

type firstUse struct {
	at   string
	line int
}

func (c *compiler) rules(n *yaml.Node, at string) []Rule {
	if d := yamlx.Deref(n); d.Kind == yaml.SequenceNode && len(d.Content) > maxRules {
		c.fail(d.Line, at, "has %d rules, more than %d", len(d.Content), maxRules)
		return nil
	}
	items, ok := c.list(n, at)
	if !ok {
		return nil
	}
	rules := make([]Rule, 0, len(items))
	ids := make(map[string]firstUse, len(items))
	prios := make(map[int32]firstUse, len(items))
	for i, item := range items {
		rat := yamlx.Index(at, i)
		r, rc := c.rule(item, rat)
		if rc.idOK {
			if prev, dup := ids[r.ID]; dup {
				c.fail(rc.idLine, rat+".id", "duplicate id %q (also %s at line %d)", r.ID, prev.at, prev.line)
			} else {
				ids[r.ID] = firstUse{rat, rc.idLine}
			}
		}
		if rc.prioOK {
			if prev, dup := prios[r.Priority]; dup {
				implicit := ""
				if rc.prioImplicit {
					implicit = " (implicit: the rule gives no priority)"
				}
				c.fail(rc.prioLine, rat+".priority", "duplicate priority %d%s (also %s at line %d)", r.Priority, implicit, prev.at, prev.line)
			} else {
				prios[r.Priority] = firstUse{rat, rc.prioLine}
			}
		}
		rules = append(rules, r)
	}
	return rules
}

// ruleCheck carries what the bundle-wide uniqueness checks need.
type ruleCheck struct {
	idOK, prioOK, prioImplicit bool
	idLine, prioLine           int
}

func (c *compiler) rule(n *yaml.Node, at string) (Rule, ruleCheck) {
	r := Rule{Line: n.Line}
	var rc ruleCheck
	fs, ok := c.fields(n, at, ruleKeys)
	if !ok {
		return r, rc
	}
	d := yamlx.Deref(n)
	var idSeen, prioSeen, thenSeen bool
	for _, f := range fs {
		fat := at + "." + f.key
		switch f.key {
		case "id":
			idSeen = true
			rc.idLine = yamlx.Deref(f.v).Line
			if s, ok := c.text(f.v, fat); ok {
				if p := idProblem(s); p != "" {
					c.fail(rc.idLine, fat, "%s", p)
				} else {
					r.ID, rc.idOK = s, true
				}
			}
		case "priority":
			prioSeen = true
			rc.prioLine = yamlx.Deref(f.v).Line
			if v, ok := c.integer(f.v, fat, math.MinInt32, math.MaxInt32); ok {
				r.Priority, rc.prioOK = int32(v), true
			}
		case "when":
			r.When = c.when(f.v, fat)
		case "then":
			thenSeen = true
			r.Then = c.then(f.v, fat)
		}
	}
	if !idSeen {
		c.fail(d.Line, at+".id", "required")
	}
	if !prioSeen {
		rc.prioOK, rc.prioImplicit, rc.prioLine = true, true, d.Line
	}
	if !thenSeen {
		c.fail(d.Line, at+".then", "required")
	}
	return r, rc
}

func idProblem(id string) string {
	switch {
	case id == "":
		return "must not be empty"
	case len(id) > maxIDBytes:
		return fmt.Sprintf("is %d bytes, longer than %d", len(id), maxIDBytes)
	case id == RuleDefault || id == RuleLocal || id == RulePermissive || id == RuleBundleError:
		return fmt.Sprintf("%q is a reserved rule id", id)
	case strings.HasPrefix(id, "__"):
		return `must not start with "__" (reserved for the kernel)`
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return "must not contain control characters"
	}
	return ""
}

var stepKinds = []string{"tool_call", "llm_call", "local"}

func (c *compiler) when(n *yaml.Node, at string) Conditions {
	fs, _ := c.fields(n, at, whenKeys)
	var w Conditions
	for _, f := range fs {
		fat := at + "." + f.key
		switch f.key {
		case "target":
			if g, ok := c.glob(f.v, fat); ok {
				w.conds = append(w.conds, cond{kind: condTarget, globs: []glob{g}})
			}
		case "targets":
			items, ok := c.list(f.v, fat)
			if !ok {
				continue
			}
			if len(items) == 0 {
				c.fail(yamlx.Deref(f.v).Line, fat, "must not be empty")
				continue
			}
			gs := make([]glob, 0, len(items))
			for i, item := range items {
				if g, ok := c.glob(item, yamlx.Index(fat, i)); ok {
					gs = append(gs, g)
				}
			}
			w.conds = append(w.conds, cond{kind: condTargets, globs: gs})
		case "agent_id":
			if s, ok := c.nonEmpty(f.v, fat); ok {
				w.conds = append(w.conds, cond{kind: condAgentID, strs: []string{s}})
			}
		case "agent_ids":
			items, ok := c.list(f.v, fat)
			if !ok {
				continue
			}
			if len(items) == 0 {
				c.fail(yamlx.Deref(f.v).Line, fat, "must not be empty")
				continue
			}
			ss := make([]string, 0, len(items))
			for i, item := range items {
				if s, ok := c.nonEmpty(item, yamlx.Index(fat, i)); ok {
					ss = append(ss, s)
				}
			}
			w.conds = append(w.conds, cond{kind: condAgentIDs, strs: ss})
		case "step_kind":
			if s, ok := c.oneOf(f.v, fat, stepKinds...); ok {
				w.conds = append(w.conds, cond{kind: condStepKind, strs: []string{s}})
			}
		case "arguments":
			if preds, ok := c.arguments(f.v, fat); ok {
				w.conds = append(w.conds, cond{kind: condArguments, args: preds})
			}
		}
	}
	return w
}

func (c *compiler) glob(n *yaml.Node, at string) (glob, bool) {
	s, ok := c.text(n, at)
	if !ok {
		return glob{}, false
	}
	if err := validGlob(s); err != nil {
		c.fail(yamlx.Deref(n).Line, at, "invalid glob %q: %v", s, err)
		return glob{}, false
	}
	return newGlob(s), true
}

func (c *compiler) arguments(n *yaml.Node, at string) ([]argPred, bool) {
	fs, ok := c.fields(n, at, nil)
	if !ok {
		return nil, false
	}
	preds := make([]argPred, 0, len(fs))
	for _, f := range fs {
		if yamlx.Deref(f.k).Tag == "!!null" {
			c.fail(f.k.Line, at, "argument names must be strings, got null")
			ok = false
			continue
		}
		p, pok := c.predicate(f.v, yamlx.Join(at, f.key))
		p.name = f.key
		preds = append(preds, p)
		ok = ok && pok
	}
	return preds, ok
}

func (c *compiler) predicate(n *yaml.Node, at string) (argPred, bool) {
	var p argPred
	fs, ok := c.fields(n, at, predicateKeys)
	if !ok {
		return p, false
	}
	// A constraint that failed validation still counts as given, so that
	// its own error is not followed by a misleading "no constraint".
	given := false
	for _, f := range fs {
		fat := at + "." + f.key
		switch f.key {
		case "equals", "contains", "regex":
			s, sok := c.constraint(f.v, fat)
			if !sok {
				ok, given = false, true
				continue
			}
			if s == "" {
				continue
			}
			given = true
			switch f.key {
			case "equals":
				p.equals = s
			case "contains":
				p.contains = s
			case "regex":
				re, rok := c.regex(s, yamlx.Deref(f.v).Line, fat)
				p.regex, ok = re, ok && rok
			}
		case "one_of":
			given = true
			items, lok := c.list(f.v, fat)
			if !lok {
				ok = false
				continue
			}
			if len(items) == 0 {
				c.fail(yamlx.Deref(f.v).Line, fat, "must not be empty")
				ok = false
				continue
			}
			p.oneOf = make([]string, 0, len(items))
			for i, item := range items {
				s, sok := c.constraint(item, yamlx.Index(fat, i))
				ok = ok && sok
				p.oneOf = append(p.oneOf, s)
			}
		}
	}
	if !given {
		c.fail(yamlx.Deref(n).Line, at, "needs at least one non-empty constraint (equals, contains, one_of or regex)")
		ok = false
	}
	return p, ok
}

// constraint reads a predicate value: a non-null scalar, taken as its
// literal text (docs/protocol/governance.md §2.3 rule 8).
func (c *compiler) constraint(n *yaml.Node, at string) (string, bool) {
	d := yamlx.Deref(n)
	if d.Kind != yaml.ScalarNode || d.Tag == "!!null" {
		hint := ""
		if d.Kind == yaml.ScalarNode {
			hint = ` (quote it to match the text "` + d.Value + `")`
			if d.Value == "" {
				hint = ""
			}
		}
		c.fail(d.Line, at, "must be a string or other scalar, got %s%s", yamlx.Describe(d), hint)
		return "", false
	}
	return d.Value, true
}

func (c *compiler) regex(s string, line int, at string) (*regexp.Regexp, bool) {
	if len(s) > maxRegexBytes {
		c.fail(line, at, "is %d bytes, longer than %d", len(s), maxRegexBytes)
		return nil, false
	}
	if re, ok := c.regexps[s]; ok {
		return re, true
	}
	re, err := regexp.Compile(s)
	if err != nil {
		c.fail(line, at, "invalid RE2 regular expression: %v", err)
		return nil, false
	}
	if c.regexps == nil {
		c.regexps = make(map[string]*regexp.Regexp)
	}
	c.regexps[s] = re
	return re, true
}

var decisions = []string{Allow, Deny, RequireApproval}

func (c *compiler) then(n *yaml.Node, at string) Then {
	var t Then
	fs, ok := c.fields(n, at, thenKeys)
	if !ok {
		return t
	}
	var approvalKey, rateKey *yaml.Node
	decisionSeen := false
	for _, f := range fs {
		fat := at + "." + f.key
		switch f.key {
		case "decision":
			decisionSeen = true
			t.Decision, _ = c.oneOf(f.v, fat, decisions...)
		case "reason":
			if s, ok := c.text(f.v, fat); ok {
				if len(s) > maxReasonBytes {
					c.fail(yamlx.Deref(f.v).Line, fat, "is %d bytes, longer than %d", len(s), maxReasonBytes)
				}
				t.Reason = s
			}
		case "approval_config":
			approvalKey = f.k
			t.Approval = c.approval(f.v, fat)
		case "rate_limit":
			rateKey = f.k
			t.RateLimit = c.rateLimit(f.v, fat)
		}
	}
	if !decisionSeen {
		c.fail(yamlx.Deref(n).Line, at+".decision", "required")
	}
	if approvalKey != nil && t.Decision != "" && t.Decision != RequireApproval {
		c.fail(approvalKey.Line, at+".approval_config", "only allowed when decision is require_approval, not %s", t.Decision)
	}
	if rateKey != nil && t.Decision == Deny {
		c.fail(rateKey.Line, at+".rate_limit", "not allowed when decision is deny")
	}
	return t
}

func (c *compiler) approval(n *yaml.Node, at string) *ApprovalConfig {
	fs, ok := c.fields(n, at, approvalKeys)
	if !ok {
		return nil
	}
	a := &ApprovalConfig{}
	for _, f := range fs {
		fat := at + "." + f.key
		switch f.key {
		case "approvers":
			items, ok := c.list(f.v, fat)
			if !ok {
				continue
			}
			a.Approvers = make([]string, 0, len(items))
			for i, item := range items {
				if s, ok := c.nonEmpty(item, yamlx.Index(fat, i)); ok {
					a.Approvers = append(a.Approvers, s)
				}
			}
		case "timeout":
			d, ok := c.duration(f.v, fat)
			if !ok {
				continue
			}
			if d < minApprovalTimeout || d > maxApprovalTimeout {
				c.fail(yamlx.Deref(f.v).Line, fat, "must be between 1s and 8760h, got %s", yamlx.Deref(f.v).Value)
				continue
			}
			a.Timeout = d
		case "message":
			if s, ok := c.text(f.v, fat); ok {
				if len(s) > maxMessageBytes {
					c.fail(yamlx.Deref(f.v).Line, fat, "is %d bytes, longer than %d", len(s), maxMessageBytes)
				}
				a.Message = s
			}
		}
	}
	return a
}

func (c *compiler) rateLimit(n *yaml.Node, at string) *RateLimit {
	fs, ok := c.fields(n, at, rateLimitKeys)
	if !ok {
		return nil
	}
	rl := &RateLimit{PerWhat: "execution", OnLimiterError: Allow}
	var maxSeen, windowSeen bool
	for _, f := range fs {
		fat := at + "." + f.key
		switch f.key {
		case "max_calls":
			maxSeen = true
			rl.MaxCalls, _ = c.integer(f.v, fat, 1, math.MaxInt64)
		case "window":
			windowSeen = true
			d, ok := c.duration(f.v, fat)
			if ok && d <= 0 {
				c.fail(yamlx.Deref(f.v).Line, fat, "must be a positive duration, got %s", yamlx.Deref(f.v).Value)
			}
			rl.Window = d
		case "per_what":
			rl.PerWhat, _ = c.oneOf(f.v, fat, "execution", "agent", "global")
		case "on_limiter_error":
			rl.OnLimiterError, _ = c.oneOf(f.v, fat, Allow, Deny)
		}
	}
	if !maxSeen {
		c.fail(yamlx.Deref(n).Line, at+".max_calls", "required")
	}
	if !windowSeen {
		c.fail(yamlx.Deref(n).Line, at+".window", "required")
	}
	return rl
}
