package policy

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// doc joins lines with newlines, so that a case's line numbers can be read
// off its position in the list.
func doc(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// allowRule is a minimal valid rule body for cases about other keys.
const okThen = "    then: {decision: allow}"

func TestParseEmptyIsNoPolicy(t *testing.T) {
	b, err := Parse("")
	if b != nil || err != nil {
		t.Fatalf(`Parse("") = %v, %v; want nil, nil`, b, err)
	}
	if errs := Check(""); errs != nil {
		t.Fatalf(`Check("") = %v; want nil`, errs)
	}
}

// TestSpecExampleMessage is the message docs/protocol/governance.md §2.3 quotes.
func TestSpecExampleMessage(t *testing.T) {
	_, err := Parse(doc(
		"default_action: deny",
		"rules:",
		"  - id: a",
		okThen,
		"  - id: b",
		"    when:",
		"      targt: web_*",
		"    priority: 1",
		okThen,
	))
	if err == nil || "invalid policy bundle: "+err.Error() != "invalid policy bundle: line 7: rules[1].when.targt: unknown key" {
		t.Fatalf("got %v", err)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error is %T, want *ValidationError", err)
	}
}

func manyRules(n int) string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {id: r%d, priority: %d, then: {decision: allow}}\n", i, i)
	}
	return b.String()
}

func TestValidation(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name    string
		text    string
		line    int
		path    string
		problem string // the exact problem, or a prefix of it ending in "…"
	}{
		// Rule 1.
		{"yaml syntax", doc("rules:", "  - id: a", "    then: {decision: allow", "  - id: b"), 3, "", "invalid YAML: did not find expected ',' or '}'"},
		// yaml.v3 reports the line where the enclosing construct starts.
		{"yaml syntax in block", doc("rules:", "  - id: a", okThen, "  id: b"), 2, "", "invalid YAML: did not find expected '-' indicator"},
		{"yaml scanner error", doc("rules:", "  - id: a", "    then: {decision: \"\\q\"}"), 3, "", "invalid YAML: found unknown escape character"},
		{"yaml tab indentation", doc("rules:", "  - id: a", "\tthen: {decision: allow}"), 2, "", "invalid YAML: found a tab character that violates indentation"},
		{"yaml syntax on line 1", "rules: a: b\n", 1, "", "invalid YAML: mapping values are not allowed in this context"},
		{"unknown anchor", doc("rules:", "  - id: a", "    then: *nothing"), 3, "", "invalid YAML: unknown anchor 'nothing' referenced"},
		{"invalid utf-8", doc("rules:", "  - id: \"a\xff\"", okThen), 2, "", "invalid YAML: invalid UTF-8"},
		{"control character", doc("rules:", "  - id: \"a\x01\"", okThen), 2, "", "invalid YAML: control character U+0001 is not allowed"},
		{"two documents", doc("default_action: deny", "---", "default_action: allow"), 2, "", "more than one YAML document"},
		{"second document empty", doc("default_action: deny", "---"), 2, "", "more than one YAML document"},
		{"local tag", doc("rules:", "  - id: !secret a", okThen), 2, "rules[0].id", "non-standard tag !secret"},
		{"yaml 1.1 tag", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      reason: !!binary aGk="), 5, "rules[0].then.reason", "non-standard tag !!binary"},
		{"tag on a mapping", doc("rules:", "  - !!set {id: a}"), 2, "rules[0]", "non-standard tag !!set"},
		{"core tag with wrong value", doc("rules:", "  - id: a", "    priority: !!int ten", okThen), 3, "rules[0].priority", `"ten" is not a valid !!int…`},
		{"duplicate top key", doc("default_action: deny", "rules: []", "default_action: allow"), 3, "default_action", "duplicate key (first at line 1)"},
		{"duplicate key in a rule", doc("rules:", "  - id: a", "    then: {decision: allow}", "    id: b"), 4, "rules[0].id", "duplicate key (first at line 2)"},
		{"duplicate key quoted and plain", doc("rules:", "  - id: a", "    when:", "      arguments:", "        n: {equals: x}", "        \"n\": {equals: y}", okThen), 6, "rules[0].when.arguments.n", "duplicate key (first at line 5)"},
		{"merge key", doc("rules:", "  - id: a", "    then: &t {decision: allow}", "  - id: b", "    priority: 1", "    then:", "      <<: *t"), 7, "rules[1].then[\"<<\"]", "merge keys are not supported"},
		{"larger than 1 MiB", "rules: []\n#" + long(1<<20), 0, "", "bundle is 1048587 bytes, larger than 1 MiB (1048576 bytes)"},
		{"more than 10000 rules", manyRules(10001), 2, "rules", "has 10001 rules, more than 10000"},

		// Rule 2.
		{"top level list", doc("- id: a"), 1, "", "the top level must be a mapping, got a list"},
		{"top level scalar", doc("deny"), 1, "", "the top level must be a mapping, got a string"},
		{"top level null", doc("~"), 1, "", "the top level must be a mapping, got null"},
		{"whitespace only", " \n\t\n", 1, "", `document is empty (send "" to remove a policy)`},
		{"comments only", doc("# no policy yet"), 1, "", `document is empty (send "" to remove a policy)`},
		{"document marker only", doc("# nothing", "---"), 2, "", `document is empty (send "" to remove a policy)`},

		// Rule 3: unknown keys at every level.
		{"unknown top key", doc("default_action: deny", "rule: []"), 2, "rule", "unknown key"},
		{"unknown rule key", doc("rules:", "  - id: a", "    priorty: 1", okThen), 3, "rules[0].priorty", "unknown key"},
		{"unknown when key", doc("rules:", "  - id: a", "    when:", "      target: x", "      targt: y", okThen), 5, "rules[0].when.targt", "unknown key"},
		{"unknown predicate key", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {equal: /srv}", okThen), 5, "rules[0].when.arguments.path.equal", "unknown key"},
		{"unknown then key", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      reasn: x"), 5, "rules[0].then.reasn", "unknown key"},
		{"unknown approval_config key", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        approver: [alice]"), 6, "rules[0].then.approval_config.approver", "unknown key"},
		{"unknown rate_limit key", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 1", "        window: 1s", "        per: agent"), 8, "rules[0].then.rate_limit.per", "unknown key"},
		{"odd key name quoted in path", doc("rules:", "  - id: a", "    when: {\"tar get\": x}", okThen), 3, `rules[0].when["tar get"]`, "unknown key"},

		// Rule 4.
		{"default_action bad", doc("default_action: block"), 1, "default_action", `must be one of "allow", "deny", got "block"`},
		{"default_action null", doc("default_action:"), 1, "default_action", "must be a string, got null"},
		{"default_action case", doc("default_action: Deny"), 1, "default_action", `must be one of "allow", "deny", got "Deny"`},
		{"rules a mapping", doc("rules:", "  id: a"), 2, "rules", "must be a list, got a mapping"},
		{"rules a scalar", doc("rules: none"), 1, "rules", "must be a list, got a string"},
		{"rules null", doc("default_action: deny", "rules:"), 2, "rules", "must be a list, got null"},
		{"rule not a mapping", doc("rules:", "  - allow"), 2, "rules[0]", "must be a mapping, got a string"},

		// Rule 5.
		{"id missing", doc("rules:", "  - priority: 1", okThen), 2, "rules[0].id", "required"},
		{"id empty", doc("rules:", "  - id: ''", okThen), 2, "rules[0].id", "must not be empty"},
		{"id null", doc("rules:", "  - id:", okThen), 2, "rules[0].id", "must be a string, got null"},
		{"id a list", doc("rules:", "  - id: [a]", okThen), 2, "rules[0].id", "must be a string, got a list"},
		{"id too long", doc("rules:", "  - id: "+long(129), okThen), 2, "rules[0].id", "is 129 bytes, longer than 128"},
		{"id control character", doc("rules:", `  - id: "a\tb"`, okThen), 2, "rules[0].id", "must not contain control characters"},
		{"id C1 control character", doc("rules:", `  - id: "a\u0085b"`, okThen), 2, "rules[0].id", "must not contain control characters"},
		{"id duplicate", doc("rules:", "  - id: a", "    priority: 1", okThen, "  - id: a", "    priority: 2", okThen), 5, "rules[1].id", `duplicate id "a" (also rules[0] at line 2)`},
		{"id default", doc("rules:", "  - id: default", okThen), 2, "rules[0].id", `"default" is a reserved rule id`},
		{"id local", doc("rules:", "  - id: local", okThen), 2, "rules[0].id", `"local" is a reserved rule id`},
		{"id permissive", doc("rules:", "  - id: permissive", okThen), 2, "rules[0].id", `"permissive" is a reserved rule id`},
		{"id bundle-error", doc("rules:", "  - id: bundle-error", okThen), 2, "rules[0].id", `"bundle-error" is a reserved rule id`},
		{"id double underscore", doc("rules:", "  - id: __indeterminate_retry", okThen), 2, "rules[0].id", `must not start with "__" (reserved for the kernel)`},

		// Rule 6.
		{"priority float", doc("rules:", "  - id: a", "    priority: 1.5", okThen), 3, "rules[0].priority", `must be a decimal integer from -2147483648 to 2147483647, got "1.5"`},
		{"priority quoted", doc("rules:", "  - id: a", "    priority: \"1\"", okThen), 3, "rules[0].priority", `must be a decimal integer (not quoted) from -2147483648 to 2147483647, got "1"`},
		{"priority above int32", doc("rules:", "  - id: a", "    priority: 2147483648", okThen), 3, "rules[0].priority", `must be a decimal integer from -2147483648 to 2147483647, got "2147483648"`},
		{"priority below int32", doc("rules:", "  - id: a", "    priority: -2147483649", okThen), 3, "rules[0].priority", `must be a decimal integer from -2147483648 to 2147483647, got "-2147483649"`},
		{"priority beyond int64", doc("rules:", "  - id: a", "    priority: 99999999999999999999", okThen), 3, "rules[0].priority", "must be a decimal integer…"},
		{"priority octal-looking", doc("rules:", "  - id: a", "    priority: 010", okThen), 3, "rules[0].priority", `must be a decimal integer from -2147483648 to 2147483647, got "010"`},
		{"priority hex", doc("rules:", "  - id: a", "    priority: 0x10", okThen), 3, "rules[0].priority", "must be a decimal integer…"},
		{"priority null", doc("rules:", "  - id: a", "    priority:", okThen), 3, "rules[0].priority", "must be a decimal integer…"},
		{"priority duplicate", doc("rules:", "  - id: a", "    priority: 5", okThen, "  - id: b", "    priority: 5", okThen), 6, "rules[1].priority", "duplicate priority 5 (also rules[0] at line 3)"},
		{"priority duplicate implicit", doc("rules:", "  - id: a", okThen, "  - id: b", okThen), 4, "rules[1].priority", "duplicate priority 0 (implicit: the rule gives no priority) (also rules[0] at line 2)"},
		{"priority explicit 0 after implicit", doc("rules:", "  - id: a", okThen, "  - id: b", "    priority: 0", okThen), 5, "rules[1].priority", "duplicate priority 0 (also rules[0] at line 2)"},

		// Rule 7.
		{"target bad glob", doc("rules:", "  - id: a", "    when: {target: \"web_[\"}", okThen), 3, "rules[0].when.target", `invalid glob "web_[": syntax error in pattern`},
		{"target trailing backslash", doc("rules:", "  - id: a", `    when: {target: 'web\'}`, okThen), 3, "rules[0].when.target", `invalid glob "web\\": syntax error in pattern`},
		{"targets entry bad glob", doc("rules:", "  - id: a", "    when:", "      targets:", "        - fs_*", "        - \"[a-\"", okThen), 6, "rules[0].when.targets[1]", `invalid glob "[a-": syntax error in pattern`},
		{"targets empty", doc("rules:", "  - id: a", "    when: {targets: []}", okThen), 3, "rules[0].when.targets", "must not be empty"},
		{"targets not a list", doc("rules:", "  - id: a", "    when: {targets: fs_*}", okThen), 3, "rules[0].when.targets", "must be a list, got a string"},
		{"target null", doc("rules:", "  - id: a", "    when:", "      target:", okThen), 4, "rules[0].when.target", "must be a string, got null"},
		{"agent_id empty", doc("rules:", "  - id: a", "    when: {agent_id: \"\"}", okThen), 3, "rules[0].when.agent_id", "must not be empty"},
		{"agent_ids empty", doc("rules:", "  - id: a", "    when: {agent_ids: []}", okThen), 3, "rules[0].when.agent_ids", "must not be empty"},
		{"agent_ids entry empty", doc("rules:", "  - id: a", "    when:", "      agent_ids:", "        - coder", "        - ''", okThen), 6, "rules[0].when.agent_ids[1]", "must not be empty"},
		{"step_kind bad", doc("rules:", "  - id: a", "    when: {step_kind: tool}", okThen), 3, "rules[0].when.step_kind", `must be one of "tool_call", "llm_call", "local", got "tool"`},
		{"when null", doc("rules:", "  - id: a", "    when:", okThen), 3, "rules[0].when", "must be a mapping, got null"},
		{"when a list", doc("rules:", "  - id: a", "    when: [target: x]", okThen), 3, "rules[0].when", "must be a mapping, got a list"},

		// Rule 8.
		{"predicate empty", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {}", okThen), 5, "rules[0].when.arguments.path", "needs at least one non-empty constraint (equals, contains, one_of or regex)"},
		{"predicate only empty strings", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path:", "          equals: ''", "          regex: \"\"", okThen), 6, "rules[0].when.arguments.path", "needs at least one non-empty constraint…"},
		{"predicate null", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path:", okThen), 5, "rules[0].when.arguments.path", "must be a mapping, got null"},
		{"arguments a list", doc("rules:", "  - id: a", "    when:", "      arguments: [path]", okThen), 4, "rules[0].when.arguments", "must be a mapping, got a list"},
		{"one_of empty", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {one_of: []}", okThen), 5, "rules[0].when.arguments.path.one_of", "must not be empty"},
		{"one_of a scalar", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {one_of: x}", okThen), 5, "rules[0].when.arguments.path.one_of", "must be a list, got a string"},
		{"one_of with a list", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path:", "          one_of:", "            - a", "            - [b]", okThen), 8, "rules[0].when.arguments.path.one_of[1]", "must be a string or other scalar, got a list"},
		{"one_of with a mapping", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {one_of: [a, {b: c}]}", okThen), 5, "rules[0].when.arguments.path.one_of[1]", "must be a string or other scalar, got a mapping"},
		{"one_of with null", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {one_of: [a, null]}", okThen), 5, "rules[0].when.arguments.path.one_of[1]", `must be a string or other scalar, got null (quote it to match the text "null")`},
		{"regex invalid", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {regex: \"(a\"}", okThen), 5, "rules[0].when.arguments.path.regex", "invalid RE2 regular expression: …"},
		{"regex not RE2", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {regex: \"(?=a)\"}", okThen), 5, "rules[0].when.arguments.path.regex", "invalid RE2 regular expression: …"},
		{"regex too long", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {regex: "+long(4097)+"}", okThen), 5, "rules[0].when.arguments.path.regex", "is 4097 bytes, longer than 4096"},
		{"equals null", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path:", "          equals: ~", okThen), 6, "rules[0].when.arguments.path.equals", `must be a string or other scalar, got null (quote it to match the text "~")`},
		{"equals empty null", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path:", "          equals:", "          contains: x", okThen), 6, "rules[0].when.arguments.path.equals", "must be a string or other scalar, got null"},
		{"contains a list", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {contains: [a]}", okThen), 5, "rules[0].when.arguments.path.contains", "must be a string or other scalar, got a list"},
		{"regex a mapping", doc("rules:", "  - id: a", "    when:", "      arguments:", "        path: {regex: {a: b}}", okThen), 5, "rules[0].when.arguments.path.regex", "must be a string or other scalar, got a mapping"},
		{"argument name null", doc("rules:", "  - id: a", "    when:", "      arguments:", "        ~: {equals: x}", okThen), 5, "rules[0].when.arguments", "argument names must be strings, got null"},
		{"argument name a list", doc("rules:", "  - id: a", "    when:", "      arguments:", "        ? [a]", "        : {equals: x}", okThen), 5, "rules[0].when.arguments", "mapping keys must be strings, got a list"},

		// Rule 9.
		{"then missing", doc("rules:", "  - id: a", "    when: {}"), 2, "rules[0].then", "required"},
		{"then null", doc("rules:", "  - id: a", "    then:"), 3, "rules[0].then", "must be a mapping, got null"},
		{"then a scalar", doc("rules:", "  - id: a", "    then: allow"), 3, "rules[0].then", "must be a mapping, got a string"},
		{"decision missing", doc("rules:", "  - id: a", "    then:", "      reason: x"), 4, "rules[0].then.decision", "required"},
		{"decision bad", doc("rules:", "  - id: a", "    then: {decision: approve}"), 3, "rules[0].then.decision", `must be one of "allow", "deny", "require_approval", got "approve"`},
		{"decision bool", doc("rules:", "  - id: a", "    then: {decision: true}"), 3, "rules[0].then.decision", `must be one of "allow", "deny", "require_approval", got "true"`},

		// Rule 10.
		{"approval_config on allow", doc("rules:", "  - id: a", "    then:", "      approval_config: {approvers: [alice]}", "      decision: allow"), 4, "rules[0].then.approval_config", "only allowed when decision is require_approval, not allow"},
		{"approval_config on deny", doc("rules:", "  - id: a", "    then:", "      decision: deny", "      approval_config: {}"), 5, "rules[0].then.approval_config", "only allowed when decision is require_approval, not deny"},
		{"approval_config null", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:"), 5, "rules[0].then.approval_config", "must be a mapping, got null"},
		{"approvers entry empty", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        approvers: [alice, '']"), 6, "rules[0].then.approval_config.approvers[1]", "must not be empty"},
		{"approvers not a list", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        approvers: alice"), 6, "rules[0].then.approval_config.approvers", "must be a list, got a string"},
		{"timeout not a duration", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        timeout: 300"), 6, "rules[0].then.approval_config.timeout", `must be a Go duration such as "90s" or "1h30m", got "300"`},
		{"timeout too short", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        timeout: 999ms"), 6, "rules[0].then.approval_config.timeout", "must be between 1s and 8760h, got 999ms"},
		{"timeout too long", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        timeout: 8760h1s"), 6, "rules[0].then.approval_config.timeout", "must be between 1s and 8760h, got 8760h1s"},
		{"message too long", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      approval_config:", "        message: "+long(4097)), 6, "rules[0].then.approval_config.message", "is 4097 bytes, longer than 4096"},

		// Rule 11.
		{"rate_limit on deny", doc("rules:", "  - id: a", "    then:", "      decision: deny", "      rate_limit: {max_calls: 1, window: 1s}"), 5, "rules[0].then.rate_limit", "not allowed when decision is deny"},
		{"max_calls zero", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 0", "        window: 1m"), 6, "rules[0].then.rate_limit.max_calls", `must be a decimal integer of at least 1, got "0"`},
		{"max_calls float", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 2.0", "        window: 1m"), 6, "rules[0].then.rate_limit.max_calls", `must be a decimal integer of at least 1, got "2.0"`},
		{"max_calls missing", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        window: 1m"), 6, "rules[0].then.rate_limit.max_calls", "required"},
		{"window missing", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 5"), 6, "rules[0].then.rate_limit.window", "required"},
		{"window zero", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 5", "        window: 0s"), 7, "rules[0].then.rate_limit.window", "must be a positive duration, got 0s"},
		{"window negative", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 5", "        window: -1m"), 7, "rules[0].then.rate_limit.window", "must be a positive duration, got -1m"},
		{"window without unit", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit:", "        max_calls: 5", "        window: 60"), 7, "rules[0].then.rate_limit.window", `must be a Go duration such as "90s" or "1h30m", got "60"`},
		{"per_what bad", doc("rules:", "  - id: a", "    then:", "      decision: allow", "      rate_limit: {max_calls: 5, window: 1m,", "        per_what: tenant}"), 6, "rules[0].then.rate_limit.per_what", `must be one of "execution", "agent", "global", got "tenant"`},
		{"on_limiter_error bad", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      rate_limit:", "        max_calls: 5", "        window: 1m", "        on_limiter_error: retry"), 8, "rules[0].then.rate_limit.on_limiter_error", `must be one of "allow", "deny", got "retry"`},

		// Rule 12.
		{"reason too long", doc("rules:", "  - id: a", "    then:", "      decision: deny", "      reason: "+long(1025)), 5, "rules[0].then.reason", "is 1025 bytes, longer than 1024"},
		{"reason null", doc("rules:", "  - id: a", "    then:", "      decision: deny", "      reason:"), 5, "rules[0].then.reason", "must be a string, got null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Parse(tt.text)
			if err == nil {
				t.Fatalf("Parse accepted the bundle (%d rules)", len(b.Rules))
			}
			if b != nil {
				t.Errorf("Parse returned a bundle with its error")
			}
			ve, ok := err.(*ValidationError)
			if !ok {
				t.Fatalf("error %v is %T, want *ValidationError", err, err)
			}
			if ve.Line != tt.line || ve.Path != tt.path || !problemMatches(ve.Problem, tt.problem) {
				t.Errorf("got  line %d, path %q, problem %q\nwant line %d, path %q, problem %q", ve.Line, ve.Path, ve.Problem, tt.line, tt.path, tt.problem)
			}
			errs := Check(tt.text)
			if len(errs) == 0 || *errs[0] != *ve {
				t.Errorf("Check()[0] = %v, want Parse's error %v", errs, ve)
			}
		})
	}
}

func problemMatches(got, want string) bool {
	if prefix, ok := strings.CutSuffix(want, "…"); ok {
		return strings.HasPrefix(got, prefix)
	}
	return got == want
}

// TestCheckReportsEverything is what `rebuno policy check` prints: every
// problem, in line order, and Parse's error is the first of them.
func TestCheckReportsEverything(t *testing.T) {
	text := doc(
		"default_action: maybe", // 1
		"rules:",                // 2
		"  - id: a",             // 3
		"    when:",             // 4
		"      targt: x",        // 5
		"    then: {decision: allow}",
		"  - id: a",                  // 7
		"    then:",                  // 8
		"      reason: !x y",         // 9
		"  - id: __c",                // 10
		"    priority: 3",            // 11
		"    then: {decision: deny,", // 12
		"      rate_limit: {max_calls: 1, window: 1s}}",
	)
	want := []string{
		`line 1: default_action: must be one of "allow", "deny", got "maybe"`,
		"line 5: rules[0].when.targt: unknown key",
		`line 7: rules[1].id: duplicate id "a" (also rules[0] at line 3)`,
		"line 7: rules[1].priority: duplicate priority 0 (implicit: the rule gives no priority) (also rules[0] at line 3)",
		"line 9: rules[1].then.reason: non-standard tag !x",
		"line 9: rules[1].then.decision: required",
		`line 10: rules[2].id: must not start with "__" (reserved for the kernel)`,
		"line 13: rules[2].then.rate_limit: not allowed when decision is deny",
	}
	errs := Check(text)
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Check:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
	if _, err := Parse(text); err == nil || err.Error() != want[0] {
		t.Errorf("Parse error = %v, want %s", err, want[0])
	}
}

func TestParseCompiles(t *testing.T) {
	text := doc(
		"rules:",
		"  - id: later",
		"    priority: 20",
		"    then: {decision: deny}",
		"  - id: approve",
		"    priority: -5",
		"    when: {target: send_email}",
		"    then:",
		"      decision: require_approval",
		"      reason: email is reviewed",
		"      approval_config:",
		"        approvers: [alice, bob]",
		"        timeout: 1h30m",
		"        message: Allow this?",
		"      rate_limit:",
		"        max_calls: 10",
		"        window: 1m",
		"  - id: implicit",
		"    then:",
		"      decision: allow",
		"      rate_limit: {max_calls: 9223372036854775807, window: 1h, per_what: global, on_limiter_error: deny}",
	)
	b, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if b.DefaultAction != Deny {
		t.Errorf("DefaultAction = %q, want deny (the default)", b.DefaultAction)
	}
	var order []string
	for _, r := range b.Rules {
		order = append(order, fmt.Sprintf("%s@%d:line%d", r.ID, r.Priority, r.Line))
	}
	if want := []string{"approve@-5:line5", "implicit@0:line18", "later@20:line2"}; !reflect.DeepEqual(order, want) {
		t.Errorf("rules = %v, want %v", order, want)
	}
	approve := b.Rules[0].Then
	wantApprove := Then{
		Decision:  RequireApproval,
		Reason:    "email is reviewed",
		Approval:  &ApprovalConfig{Approvers: []string{"alice", "bob"}, Timeout: 90 * time.Minute, Message: "Allow this?"},
		RateLimit: &RateLimit{MaxCalls: 10, Window: time.Minute, PerWhat: "execution", OnLimiterError: "allow"},
	}
	if !reflect.DeepEqual(approve, wantApprove) {
		t.Errorf("approve.Then = %+v %+v %+v", approve, approve.Approval, approve.RateLimit)
	}
	rl := b.Rules[1].Then.RateLimit
	if want := (RateLimit{MaxCalls: math.MaxInt64, Window: time.Hour, PerWhat: "global", OnLimiterError: "deny"}); rl == nil || *rl != want {
		t.Errorf("implicit rate limit = %+v, want %+v", rl, want)
	}
	if b.Rules[2].Then.Approval != nil || b.Rules[2].Then.RateLimit != nil {
		t.Errorf("later rule has approval or rate limit: %+v", b.Rules[2].Then)
	}
}

// TestParseAccepts covers valid texts at the edges of the rules.
func TestParseAccepts(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	exactly1MiB := func() string {
		s := "default_action: allow\n#"
		return s + long(1<<20-len(s))
	}()
	tests := []struct{ name, text string }{
		{"empty mapping", "{}\n"},
		{"only default", "default_action: allow\n"},
		{"no rules", "rules: []\n"},
		{"exactly 1 MiB", exactly1MiB},
		{"exactly 10000 rules", manyRules(10000)},
		{"id of 128 bytes", doc("rules:", "  - id: "+long(128), okThen)},
		{"id with unicode", doc("rules:", "  - id: règle-1", okThen)},
		{"id with single underscore", doc("rules:", "  - id: _a", okThen)},
		{"id that merely contains a reserved word", doc("rules:", "  - id: default-deny", okThen)},
		{"id numeric", doc("rules:", "  - id: 7", okThen)},
		{"priority int32 edges", doc("rules:", "  - id: a", "    priority: -2147483648", okThen, "  - id: b", "    priority: 2147483647", okThen, "  - id: c", "    priority: +5", okThen)},
		{"empty when", doc("rules:", "  - id: a", "    when: {}", okThen)},
		{"empty target pattern", doc("rules:", "  - id: a", "    when: {target: ''}", okThen)},
		{"arguments without predicates", doc("rules:", "  - id: a", "    when: {arguments: {}}", okThen)},
		{"one_of with an empty string", doc("rules:", "  - id: a", "    when: {arguments: {p: {one_of: ['']}}}", okThen)},
		{"empty constraint beside a real one", doc("rules:", "  - id: a", "    when: {arguments: {p: {equals: '', contains: x}}}", okThen)},
		{"regex of 4096 bytes", doc("rules:", "  - id: a", "    when: {arguments: {p: {regex: "+long(4096)+"}}}", okThen)},
		{"timeout edges", doc("rules:", "  - id: a", "    then: {decision: require_approval, approval_config: {timeout: 1s}}", "  - id: b", "    priority: 1", "    then: {decision: require_approval, approval_config: {timeout: 8760h}}")},
		{"approvers empty list", doc("rules:", "  - id: a", "    then: {decision: require_approval, approval_config: {approvers: []}}")},
		{"reason and message at their limits", doc("rules:", "  - id: a", "    then:", "      decision: require_approval", "      reason: "+long(1024), "      approval_config: {message: "+long(4096)+"}")},
		{"reason empty", doc("rules:", "  - id: a", "    then: {decision: deny, reason: ''}")},
		{"core tags", doc("rules:", "  - !!map", "    id: !!str a", "    priority: !!int 3", "    when: {targets: !!seq [x]}", okThen)},
		{"aliases", doc("rules:", "  - id: a", "    when: {agent_ids: &team [alice, bob]}", "    then:", "      decision: require_approval", "      approval_config: {approvers: *team}")},
		{"document markers", doc("---", "default_action: deny", "...")},
		{"crlf line ends", "rules:\r\n  - id: a\r\n    then: {decision: allow}\r\n"},
		{"byte order mark", "\uFEFFdefault_action: allow\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Parse(tt.text)
			if err != nil {
				t.Fatal(err)
			}
			if b == nil {
				t.Fatal("Parse returned no bundle")
			}
		})
	}
}

// TestScalarsAreLiteralText checks docs/protocol/governance.md §2.3 rule 8: a non-string scalar means
// its YAML text, not the value YAML would decode.
func TestScalarsAreLiteralText(t *testing.T) {
	b, err := Parse(doc(
		"rules:",
		"  - id: a",
		"    when:",
		"      agent_id: 007",
		"      arguments:",
		"        int: {equals: 5}",
		"        float: {equals: 1.0}",
		"        bool: {equals: true}",
		"        hex: {equals: 0x10}",
		"        exp: {one_of: [1e3, 2.50, yes, False]}",
		"        date: {contains: 2024-01-02}",
		"        tagged: {equals: !!str 12}",
		okThen,
	))
	if err != nil {
		t.Fatal(err)
	}
	conds := b.Rules[0].When.conds
	if got := conds[0].strs[0]; got != "007" {
		t.Errorf("agent_id = %q, want 007", got)
	}
	want := map[string]string{"int": "5", "float": "1.0", "bool": "true", "hex": "0x10", "tagged": "12"}
	for _, p := range conds[1].args {
		switch p.name {
		case "exp":
			if !reflect.DeepEqual(p.oneOf, []string{"1e3", "2.50", "yes", "False"}) {
				t.Errorf("one_of = %q", p.oneOf)
			}
		case "date":
			if p.contains != "2024-01-02" {
				t.Errorf("contains = %q", p.contains)
			}
		default:
			if p.equals != want[p.name] {
				t.Errorf("%s: equals = %q, want %q", p.name, p.equals, want[p.name])
			}
		}
	}
}

// TestAliasExpansionBounded keeps a small text from costing unbounded work:
// one 20,000-entry list reused by 200 rules would be 4 million nodes.
func TestAliasExpansionBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("big: &big [" + strings.Repeat("a,", 19999) + "a]\nrules:\n")
	for i := range 200 {
		fmt.Fprintf(&b, "  - {id: r%d, priority: %d, when: {arguments: {x: {one_of: *big}}}, then: {decision: allow}}\n", i, i)
	}
	// The stray top-level "big" key is itself an error; the bound must be
	// reported too and the walk must stop early.
	errs := Check(b.String())
	var bounded bool
	for _, e := range errs {
		if strings.HasPrefix(e.Problem, "aliases expand the bundle beyond") {
			bounded = true
		}
	}
	if !bounded || len(errs) > 5 {
		t.Errorf("errors = %v", errs)
	}
}

func TestParseDoesNotShareRegexpsWrongly(t *testing.T) {
	b, err := Parse(doc(
		"rules:",
		"  - id: a",
		"    when: {arguments: {p: {regex: &re '^x'}, q: {regex: *re}, r: {regex: '^y'}}}",
		okThen,
	))
	if err != nil {
		t.Fatal(err)
	}
	args := b.Rules[0].When.conds[0].args
	if args[0].regex != args[1].regex || args[0].regex == args[2].regex || args[2].regex.String() != "^y" {
		t.Errorf("regexps: %v %v %v", args[0].regex, args[1].regex, args[2].regex)
	}
}
