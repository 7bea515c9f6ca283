package policy

import (
	"fmt"
	"strings"
	"testing"
)

// bundle200 is the governance benchmark's bundle: 200 rules whose winner is
// the last tried, each loser failing on its target glob. The losers mix the
// shapes real bundles use: a literal prefix ("tool_007_*"), a literal
// suffix ("*_007"), and wildcards at both ends ("*tool_007*"), which no
// cheap check rejects and so always run path.Match. With worst set, every
// loser has the last shape.
func bundle200(worst bool) string {
	var b strings.Builder
	b.WriteString("default_action: deny\nrules:\n")
	for i := range 199 {
		pattern := fmt.Sprintf("*tool_%03d*", i)
		if !worst {
			pattern = []string{"tool_%03d_*", "*_%03d", "*tool_%03d*"}[i%3]
			pattern = fmt.Sprintf(pattern, i)
		}
		fmt.Fprintf(&b, "  - id: rule-%03d\n    priority: %d\n    when:\n      step_kind: tool_call\n      target: \"%s\"\n    then: {decision: deny}\n", i, i*10, pattern)
	}
	b.WriteString(`  - id: winner
    priority: 5000
    when:
      step_kind: tool_call
      targets: ["*_tool_final"]
      arguments:
        path: {regex: '^/srv/(data|cache)/'}
    then:
      decision: allow
      rate_limit: {max_calls: 10, window: 1m}
`)
	return b.String()
}

func benchmarkEvaluate(b *testing.B, worst bool) {
	bundle := mustParse(b, bundle200(worst))
	f := Facts{AgentID: "researcher", Kind: "tool_call", Target: "fs_tool_final", Args: args(b, `{"path":"/srv/data/report.csv","mode":"r"}`)}
	if r := bundle.Evaluate(f); r.RuleID != "winner" || len(bundle.Rules) != 200 {
		b.Fatalf("winner not reached: %+v", r)
	}
	b.ReportAllocs()
	for b.Loop() {
		bundle.Evaluate(f)
	}
}

func BenchmarkEvaluate200Rules(b *testing.B) { benchmarkEvaluate(b, false) }

func BenchmarkEvaluate200RulesWorstCase(b *testing.B) { benchmarkEvaluate(b, true) }

func BenchmarkExplain200Rules(b *testing.B) {
	bundle := mustParse(b, bundle200(false))
	f := Facts{AgentID: "researcher", Kind: "tool_call", Target: "fs_tool_final", Args: args(b, `{"path":"/srv/data/report.csv"}`)}
	b.ReportAllocs()
	for b.Loop() {
		bundle.Explain(f)
	}
}

func BenchmarkParse200Rules(b *testing.B) {
	text := bundle200(false)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(text); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCacheHit(b *testing.B) {
	c := NewCache(DefaultCacheSize)
	text := bundle200(false)
	if _, err := c.Get(text); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Get(text)
		}
	})
}
