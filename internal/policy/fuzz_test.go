package policy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rebuno/rebuno/internal/jsonx"
)

// FuzzParse feeds arbitrary text to the compiler: it must never panic,
// Parse and Check must agree, and a compiled bundle must evaluate.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../../examples/policies/*.yaml")
	for _, file := range files {
		if text, err := os.ReadFile(file); err == nil {
			f.Add(string(text))
		}
	}
	for _, s := range []string{
		"", "{}", "rules: []", "default_action: allow\n",
		doc("rules:", "  - id: a", "    when: {target: 'web_*', arguments: {p: {regex: '^x', one_of: [1, b]}}}", okThen),
		doc("rules:", "  - id: a", "    when: {agent_ids: &t [x]}", "    then: {decision: require_approval, approval_config: {approvers: *t}}"),
		doc("a: 1", "---", "b: 2"), "- x", "rules: [{id: a, then: {decision: deny, rate_limit: {max_calls: 1, window: 1s}}}]",
	} {
		f.Add(s)
	}
	args, _ := jsonx.Parse([]byte(`{"p":"x1","path":"/srv/data","to":"a@example.com","n":5,"o":{"k":[1]}}`), 128)
	f.Fuzz(func(t *testing.T, text string) {
		b, err := Parse(text)
		errs := Check(text)
		if (err == nil) != (len(errs) == 0) {
			t.Fatalf("Parse error %v but Check found %d errors", err, len(errs))
		}
		if err != nil {
			if b != nil {
				t.Fatal("a bundle with an error")
			}
			if err.Error() != errs[0].Error() {
				t.Fatalf("Parse error %q is not Check's first %q", err, errs[0])
			}
			for _, e := range errs {
				if e.Line < 0 || e.Problem == "" {
					t.Fatalf("malformed error %+v", e)
				}
			}
			return
		}
		if text != "" && b == nil {
			t.Fatal("no bundle and no error for non-empty text")
		}
		for _, kind := range []string{"tool_call", "llm_call", "local"} {
			for _, target := range []string{"", "web_search", "x/y", "send_email"} {
				f := Facts{AgentID: "x", Kind: kind, Target: target, Args: args}
				r, traces := b.Explain(f)
				if r != b.Evaluate(f) {
					t.Fatal("Explain and Evaluate disagree")
				}
				if r.Decision == "" || r.RuleID == "" || (b != nil && len(traces) == 0 && len(b.Rules) > 0) {
					t.Fatalf("result %+v, %d traces", r, len(traces))
				}
			}
		}
	})
}
