package policy

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/jsonx"
)

func mustParse(t testing.TB, text string) *Bundle {
	t.Helper()
	b, err := Parse(text)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, text)
	}
	return b
}

func args(t testing.TB, s string) *jsonx.Value {
	t.Helper()
	if s == "" {
		return nil
	}
	v, err := jsonx.Parse([]byte(s), 128)
	if err != nil {
		t.Fatalf("jsonx.Parse(%s): %v", s, err)
	}
	return v
}

// decide is one evaluation: facts in, decision and rule id out.
type decide struct {
	name    string
	agent   string
	kind    string
	target  string
	args    string // JSON; "" = absent
	rule    string
	outcome string
	reason  string
}

func runDecisions(t *testing.T, b *Bundle, cases []decide) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			kind := tt.kind
			if kind == "" {
				kind = "tool_call"
			}
			f := Facts{AgentID: tt.agent, Kind: kind, Target: tt.target, Args: args(t, tt.args)}
			got := b.Evaluate(f)
			if got.RuleID != tt.rule || got.Decision != tt.outcome || (tt.reason != "" && got.Reason != tt.reason) {
				t.Errorf("Evaluate(%+v) = %s by %q (%q), want %s by %q (%q)", f, got.Decision, got.RuleID, got.Reason, tt.outcome, tt.rule, tt.reason)
			}
			// Explain must agree with Evaluate.
			if ex, _ := b.Explain(f); !reflect.DeepEqual(ex, got) {
				t.Errorf("Explain result %+v differs from Evaluate %+v", ex, got)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	var none *Bundle
	if got := none.Evaluate(Facts{Kind: "tool_call", Target: "x"}); got != (Result{Decision: Allow, RuleID: "permissive"}) {
		t.Errorf("nil bundle: %+v", got)
	}
	if got, traces := none.Explain(Facts{Kind: "tool_call"}); got.RuleID != "permissive" || traces != nil {
		t.Errorf("nil bundle Explain: %+v %v", got, traces)
	}

	deny := mustParse(t, doc("rules:", "  - id: web", "    when: {target: web_*}", "    then: {decision: allow}"))
	runDecisions(t, deny, []decide{
		{name: "deny default", target: "fs_read", rule: "default", outcome: Deny, reason: "no explicit allow rule matched"},
		{name: "llm under deny default", kind: "llm_call", target: "gpt-4o", rule: "default", outcome: Deny, reason: "no explicit allow rule matched"},
		{name: "local under deny default", kind: "local", target: "compute", rule: "local", outcome: Allow, reason: "local step"},
		{name: "rule still applies to local", kind: "local", target: "web_step", rule: "web", outcome: Allow},
	})

	allow := mustParse(t, doc("default_action: allow", "rules:", "  - id: no-local-rm", "    when: {step_kind: local, target: rm_*}", "    then: {decision: deny}"))
	runDecisions(t, allow, []decide{
		{name: "allow default", target: "anything", rule: "default", outcome: Allow, reason: "default allow"},
		{name: "local without rule", kind: "local", target: "x", rule: "local", outcome: Allow, reason: "local step"},
		{name: "explicit rule denies a local step", kind: "local", target: "rm_tree", rule: "no-local-rm", outcome: Deny, reason: "policy_denied"},
	})

	empty := mustParse(t, "{}\n")
	runDecisions(t, empty, []decide{
		{name: "no rules at all", target: "x", rule: "default", outcome: Deny, reason: "no explicit allow rule matched"},
	})
}

func TestPriorityAndFirstMatch(t *testing.T) {
	b := mustParse(t, doc(
		"rules:",
		"  - id: catch-all",
		"    priority: 100",
		"    then: {decision: deny, reason: nothing else}",
		"  - id: fs-read",
		"    priority: 10",
		"    when: {target: fs_read}",
		"    then: {decision: allow}",
		"  - id: fs-any",
		"    priority: 20",
		"    when: {target: fs_*}",
		"    then: {decision: require_approval}",
		"  - id: first",
		"    priority: -1",
		"    when: {target: fs_read, agent_id: intruder}",
		"    then: {decision: deny, reason: not you}",
	))
	runDecisions(t, b, []decide{
		{name: "lowest priority wins over declaration order", agent: "intruder", target: "fs_read", rule: "first", outcome: Deny, reason: "not you"},
		{name: "first match wins", agent: "coder", target: "fs_read", rule: "fs-read", outcome: Allow},
		{name: "next rule", agent: "coder", target: "fs_write", rule: "fs-any", outcome: RequireApproval},
		{name: "catch-all", agent: "coder", target: "web", rule: "catch-all", outcome: Deny, reason: "nothing else"},
		{name: "catch-all covers local too", kind: "local", target: "x", rule: "catch-all", outcome: Deny},
	})
}

func TestConditions(t *testing.T) {
	b := mustParse(t, doc(
		"rules:",
		"  - id: target",
		"    priority: 1",
		"    when: {target: web_search}",
		"    then: {decision: allow}",
		"  - id: targets",
		"    priority: 2",
		"    when: {targets: [fs_read, 'db_*']}",
		"    then: {decision: allow}",
		"  - id: agent",
		"    priority: 3",
		"    when: {agent_id: alice}",
		"    then: {decision: allow}",
		"  - id: agents",
		"    priority: 4",
		"    when: {agent_ids: [bob, carol]}",
		"    then: {decision: allow}",
		"  - id: kind",
		"    priority: 5",
		"    when: {step_kind: llm_call}",
		"    then: {decision: allow}",
		"  - id: anded",
		"    priority: 6",
		"    when: {step_kind: local, target: 'job_*', agent_id: dave}",
		"    then: {decision: deny}",
	))
	runDecisions(t, b, []decide{
		{name: "target exact", target: "web_search", rule: "target", outcome: Allow},
		{name: "target is whole", target: "web_search_2", rule: "default", outcome: Deny},
		{name: "targets first", target: "fs_read", rule: "targets", outcome: Allow},
		{name: "targets glob", target: "db_query", rule: "targets", outcome: Allow},
		{name: "targets none", target: "fs_write", rule: "default", outcome: Deny},
		{name: "agent_id", agent: "alice", target: "x", rule: "agent", outcome: Allow},
		{name: "agent_id is exact", agent: "Alice", target: "x", rule: "default", outcome: Deny},
		{name: "agent_id prefix only", agent: "alice2", target: "x", rule: "default", outcome: Deny},
		{name: "agent_ids", agent: "carol", target: "x", rule: "agents", outcome: Allow},
		{name: "no agent never matches", agent: "", target: "x", rule: "default", outcome: Deny},
		{name: "step_kind", kind: "llm_call", target: "gpt", rule: "kind", outcome: Allow},
		{name: "step_kind other", kind: "tool_call", target: "gpt", rule: "default", outcome: Deny},
		{name: "all conditions hold", agent: "dave", kind: "local", target: "job_1", rule: "anded", outcome: Deny},
		{name: "one condition fails", agent: "erin", kind: "local", target: "job_1", rule: "local", outcome: Allow},
	})
}

func TestGlobs(t *testing.T) {
	tests := []struct {
		pattern, target string
		want            bool
	}{
		{"web_*", "web_search", true},
		{"web_*", "web_", true},
		{"web_*", "web", false},
		{"web_*", "xweb_search", false},
		{"*", "", true},
		{"*", "anything", true},
		{"*", "a/b", false}, // * does not cross /
		{"mcp/*", "mcp/fs_read", true},
		{"mcp/*", "mcp/fs/read", false},
		{"mcp/*/*", "mcp/fs/read", true},
		{"*/read", "fs/read", true},
		{"fs_?ead", "fs_read", true},
		{"fs_?ead", "fs_ead", false},
		{"a?b", "a/b", false},  // ? does not match /
		{"caf?", "café", true}, // ? is one character, not one byte
		{"v[0-9]", "v7", true},
		{"v[0-9]", "vx", false},
		{"v[^0-9]", "vx", true},
		{"v[^0-9]", "v7", false},
		{"[abc]_tool", "b_tool", true},
		{"[abc]_tool", "d_tool", false},
		{`file\*`, "file*", true},
		{`file\*`, "files", false},
		{`\?`, "?", true},
		// Byte equality also matches a pattern whose glob reading would not.
		{"[a]", "[a]", true},
		{"[a]", "a", true},
		{`a\b`, `a\b`, true},
		{`a\b`, "ab", true},
		{"", "", true},
		{"", "x", false},
		{"gpt-4o*", "gpt-4o-mini", true},
		{"claude-*", "claude-3-5-sonnet", true},
	}
	for _, tt := range tests {
		g := newGlob(tt.pattern)
		if got := g.match(tt.target); got != tt.want {
			t.Errorf("glob %q on %q = %v, want %v", tt.pattern, tt.target, got, tt.want)
		}
	}
	// And through a bundle, with YAML quoting.
	b := mustParse(t, doc("rules:", "  - id: g", `    when: {target: 'file\*'}`, "    then: {decision: allow}"))
	if got := b.Evaluate(Facts{Kind: "tool_call", Target: "file*"}); got.RuleID != "g" {
		t.Errorf("escaped glob via bundle: %+v", got)
	}
}

func TestArguments(t *testing.T) {
	// Every rule allows, and rule i has priority i.
	whens := [][2]string{
		{"path", "{target: fs_read, arguments: {path: {contains: data, regex: '^/srv/'}}}"},
		{"exact", "{target: exact, arguments: {v: {equals: '5'}}}"},
		{"float", "{target: float, arguments: {v: {equals: 5.0}}}"},
		{"bool", "{target: bool, arguments: {v: {one_of: [true, 'false']}}}"},
		{"is-null", "{target: 'null', arguments: {v: {equals: 'null'}}}"},
		{"array", `{target: array, arguments: {v: {equals: '["a","b"]'}}}`},
		{"object", `{target: object, arguments: {v: {equals: '{"a":2,"b":[1,{"c":null}]}'}}}`},
		{"exp", "{target: exp, arguments: {v: {equals: 1e21}}}"},
		{"unanchored", "{target: unanchored, arguments: {v: {regex: 'b+'}}}"},
		{"several", "{target: several, arguments: {a: {equals: x}, b: {one_of: [y, z]}}}"},
		{"empty-is-absent", "{target: empty, arguments: {v: {equals: '', contains: o}}}"},
		{"any-object", "{target: object-only, arguments: {}}"},
		{"unicode", `{target: unicode, arguments: {v: {equals: "é\"<\n"}}}`},
	}
	text := "rules:\n"
	for i, w := range whens {
		text += fmt.Sprintf("  - id: %s\n    priority: %d\n    when: %s\n    then: {decision: allow}\n", w[0], i, w[1])
	}
	b := mustParse(t, text)
	runDecisions(t, b, []decide{
		{name: "path matches", target: "fs_read", args: `{"path":"/srv/data/x"}`, rule: "path", outcome: Allow},
		{name: "every constraint must hold", target: "fs_read", args: `{"path":"/srv/cache"}`, rule: "default", outcome: Deny},
		{name: "regex fails", target: "fs_read", args: `{"path":"/home/data"}`, rule: "default", outcome: Deny},
		{name: "key missing", target: "fs_read", args: `{"file":"/srv/data"}`, rule: "default", outcome: Deny},
		{name: "key only nested", target: "fs_read", args: `{"opts":{"path":"/srv/data"}}`, rule: "default", outcome: Deny},
		{name: "args absent", target: "fs_read", rule: "default", outcome: Deny},
		{name: "args null", target: "fs_read", args: `null`, rule: "default", outcome: Deny},
		{name: "args an array", target: "fs_read", args: `[{"path":"/srv/data"}]`, rule: "default", outcome: Deny},
		{name: "args a string", target: "fs_read", args: `"/srv/data"`, rule: "default", outcome: Deny},
		{name: "string equals", target: "exact", args: `{"v":"5"}`, rule: "exact", outcome: Allow},
		{name: "number 5 is 5", target: "exact", args: `{"v":5}`, rule: "exact", outcome: Allow},
		{name: "number 5.0 is not 5", target: "exact", args: `{"v":5.0}`, rule: "default", outcome: Deny},
		{name: "number 5e0 is not 5", target: "exact", args: `{"v":5e0}`, rule: "default", outcome: Deny},
		{name: "yaml 5.0 is text 5.0", target: "float", args: `{"v":5.0}`, rule: "float", outcome: Allow},
		{name: "yaml 5.0 does not match 5", target: "float", args: `{"v":5}`, rule: "default", outcome: Deny},
		{name: "true", target: "bool", args: `{"v":true}`, rule: "bool", outcome: Allow},
		{name: "false", target: "bool", args: `{"v":false}`, rule: "bool", outcome: Allow},
		{name: "string true", target: "bool", args: `{"v":"true"}`, rule: "bool", outcome: Allow},
		{name: "bool not one_of", target: "bool", args: `{"v":"yes"}`, rule: "default", outcome: Deny},
		{name: "null value exists", target: "null", args: `{"v":null}`, rule: "is-null", outcome: Allow},
		{name: "array canonical", target: "array", args: `[1]`, rule: "default", outcome: Deny},
		{name: "array value", target: "array", args: `{"v":[ "a" , "b" ]}`, rule: "array", outcome: Allow},
		{name: "object canonical order", target: "object", args: `{"v":{"b":[1,{"c":null}],"a":2}}`, rule: "object", outcome: Allow},
		{name: "exponent literal", target: "exp", args: `{"v":1e21}`, rule: "exp", outcome: Allow},
		{name: "exponent not reformatted", target: "exp", args: `{"v":1000000000000000000000}`, rule: "default", outcome: Deny},
		{name: "regex is a search", target: "unanchored", args: `{"v":"abbbc"}`, rule: "unanchored", outcome: Allow},
		{name: "regex on a number", target: "unanchored", args: `{"v":123}`, rule: "default", outcome: Deny},
		{name: "regex on canonical json", target: "unanchored", args: `{"v":{"b":1}}`, rule: "unanchored", outcome: Allow},
		{name: "two keys", target: "several", args: `{"a":"x","b":"z","c":0}`, rule: "several", outcome: Allow},
		{name: "two keys, one fails", target: "several", args: `{"a":"x","b":"w"}`, rule: "default", outcome: Deny},
		{name: "empty equals is absent", target: "empty", args: `{"v":"foo"}`, rule: "empty-is-absent", outcome: Allow},
		{name: "empty object rule needs an object", target: "object-only", args: `{}`, rule: "any-object", outcome: Allow},
		{name: "empty object rule refuses null", target: "object-only", args: `null`, rule: "default", outcome: Deny},
		{name: "decoded string", target: "unicode", args: `{"v":"\u00e9\"\u003c\n"}`, rule: "unicode", outcome: Allow},
	})
}

// TestArgumentsHandBuilt covers Values not made by jsonx.Parse: a nil
// member value is JSON null and present, and of repeated keys the last
// counts, as in canonical JSON.
func TestArgumentsHandBuilt(t *testing.T) {
	b := mustParse(t, doc("rules:", "  - id: n", "    when: {arguments: {v: {equals: 'null'}}}", "    then: {decision: allow}"))
	str := func(s string) *jsonx.Value { return &jsonx.Value{Kind: jsonx.KindString, Str: s} }
	for _, tt := range []struct {
		name string
		args *jsonx.Value
		rule string
	}{
		{"nil member is null", &jsonx.Value{Kind: jsonx.KindObject, Members: []jsonx.Member{{Key: "v"}}}, "n"},
		{"last repeated key wins", &jsonx.Value{Kind: jsonx.KindObject, Members: []jsonx.Member{{Key: "v", Value: str("x")}, {Key: "v", Value: str("null")}}}, "n"},
		{"earlier repeated key ignored", &jsonx.Value{Kind: jsonx.KindObject, Members: []jsonx.Member{{Key: "v", Value: str("null")}, {Key: "v", Value: str("x")}}}, "default"},
	} {
		if got := b.Evaluate(Facts{Kind: "tool_call", Args: tt.args}); got.RuleID != tt.rule {
			t.Errorf("%s: rule %q, want %q", tt.name, got.RuleID, tt.rule)
		}
	}
}

func TestResultCarriesThen(t *testing.T) {
	b := mustParse(t, doc(
		"rules:",
		"  - id: mail",
		"    when: {target: send_email}",
		"    then:",
		"      decision: require_approval",
		"      reason: mail is reviewed",
		"      approval_config: {approvers: [alice], timeout: 5m, message: 'ok?'}",
		"      rate_limit: {max_calls: 3, window: 1h, per_what: agent}",
	))
	got := b.Evaluate(Facts{Kind: "tool_call", Target: "send_email"})
	if got.Decision != RequireApproval || got.RuleID != "mail" || got.Reason != "mail is reviewed" {
		t.Fatalf("got %+v", got)
	}
	if got.Approval != b.Rules[0].Then.Approval || got.Approval.Approvers[0] != "alice" {
		t.Errorf("approval = %+v", got.Approval)
	}
	if got.RateLimit == nil || got.RateLimit.MaxCalls != 3 || got.RateLimit.PerWhat != "agent" || got.RateLimit.OnLimiterError != "allow" {
		t.Errorf("rate limit = %+v", got.RateLimit)
	}
	if def := b.Evaluate(Facts{Kind: "tool_call", Target: "x"}); def.Approval != nil || def.RateLimit != nil {
		t.Errorf("default result carries a then: %+v", def)
	}
}

func TestExplain(t *testing.T) {
	b := mustParse(t, doc(
		"rules:",
		"  - id: search-ok", // 2
		"    priority: 10",
		"    when: {step_kind: tool_call, target: 'web_*'}",
		"    then: {decision: allow}",
		"  - id: team", // 6
		"    priority: 20",
		"    when: {agent_ids: [alice, bob]}",
		"    then: {decision: allow}",
		"  - id: fs", // 10
		"    priority: 30",
		"    when:",
		"      targets: [fs_read, 'fs_list*']",
		"      agent_id: coder",
		"    then: {decision: allow}",
		"  - id: args", // 16
		"    priority: 40",
		"    when:",
		"      arguments:",
		"        path: {equals: /srv}",
		"    then: {decision: allow}",
		"  - id: args-more", // 22
		"    priority: 50",
		"    when:",
		"      arguments:",
		"        mode: {one_of: [r, w]}",
		"        path: {contains: srv}",
		"    then: {decision: allow}",
		"  - id: regex", // 29
		"    priority: 60",
		"    when: {arguments: {path: {regex: '^/srv/'}}}",
		"    then: {decision: allow}",
		"  - id: kind", // 33
		"    priority: 70",
		"    when: {step_kind: llm_call}",
		"    then: {decision: allow}",
		"  - id: last", // 37
		"    priority: 80",
		"    when: {target: fs_write}",
		"    then: {decision: deny, reason: read only}",
	))
	f := Facts{AgentID: "researcher", Kind: "tool_call", Target: "fs_write", Args: args(t, `{"path":"/home/x","mode":"rw"}`)}
	res, traces := b.Explain(f)
	if res != (Result{Decision: Deny, RuleID: "last", Reason: "read only"}) {
		t.Errorf("result = %+v", res)
	}
	want := []Trace{
		{"search-ok", 10, 2, false, `target "fs_write" does not match "web_*"`},
		{"team", 20, 6, false, `agent_id "researcher" is not one of ["alice", "bob"]`},
		{"fs", 30, 10, false, `target "fs_write" matches none of ["fs_read", "fs_list*"]`},
		{"args", 40, 16, false, `argument "path" = "/home/x" does not equal "/srv"`},
		{"args-more", 50, 22, false, `argument "mode" = "rw" is not one of ["r", "w"]`},
		{"regex", 60, 29, false, `argument "path" = "/home/x" does not match regex "^/srv/"`},
		{"kind", 70, 33, false, `step_kind "tool_call" is not "llm_call"`},
		{"last", 80, 37, true, ""},
	}
	if !reflect.DeepEqual(traces, want) {
		t.Errorf("traces:\n got %+v\nwant %+v", traces, want)
	}

	// Other failure texts, and a trace with no winner.
	for _, tt := range []struct {
		name string
		f    Facts
		want string
	}{
		{"agent_id", Facts{AgentID: "x", Kind: "tool_call", Target: "fs_read"}, `agent_id "x" is not "coder"`},
		{"missing argument", Facts{Kind: "tool_call", Args: args(t, `{"p":1}`)}, `argument "path" is missing`},
		{"args absent", Facts{Kind: "tool_call"}, "arguments: args are null or absent, not a JSON object"},
		{"args an array", Facts{Kind: "tool_call", Args: args(t, `[1]`)}, "arguments: args are a JSON array, not a JSON object"},
		{"contains", Facts{Kind: "tool_call", Args: args(t, `{"mode":"r","path":"/x"}`)}, `argument "path" = "/x" does not contain "srv"`},
		{"long argument clipped", Facts{Kind: "tool_call", Args: args(t, `{"path":"`+strings.Repeat("é", 60)+`"}`)}, `argument "path" = "` + strings.Repeat("é", 40) + `"… does not equal "/srv"`},
	} {
		_, traces := b.Explain(tt.f)
		var found bool
		for _, tr := range traces {
			if tr.Failed == tt.want {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no trace says %q: %+v", tt.name, tt.want, traces)
		}
	}

	_, traces = b.Explain(Facts{Kind: "tool_call", Target: "nothing"})
	if len(traces) != len(b.Rules) {
		t.Errorf("no winner: %d traces for %d rules", len(traces), len(b.Rules))
	}
	for _, tr := range traces {
		if tr.Matched || tr.Failed == "" {
			t.Errorf("no winner: trace %+v", tr)
		}
	}
}

// TestExplainConditionOrder: the failure named is the first in the order
// the rule lists its conditions.
func TestExplainConditionOrder(t *testing.T) {
	b := mustParse(t, doc(
		"rules:",
		"  - id: a",
		"    when: {agent_id: bob, target: x}",
		"    then: {decision: allow}",
		"  - id: b",
		"    priority: 1",
		"    when: {target: x, agent_id: bob}",
		"    then: {decision: allow}",
	))
	_, traces := b.Explain(Facts{AgentID: "alice", Kind: "tool_call", Target: "y"})
	if traces[0].Failed != `agent_id "alice" is not "bob"` || traces[1].Failed != `target "y" does not match "x"` {
		t.Errorf("traces = %+v", traces)
	}
}
