package policy

import (
	"math/rand/v2"
	"path"
	"testing"
)

var globSeeds = []string{
	"", "*", "**", "a*", "*a", "a*b", "*a*", "a*b*c", "*/*", "a/*", "*/b", "?", "??", "a?c", "?/?",
	"[abc]", "[^abc]", "[a-c]", "[^a-c]x", "[a-cx-z]", "[\\]]", "[\\-]", "[*]", "[?]", "[[]", "a[*]b*",
	"\\*", "\\?", "\\[", "a\\b", "\\\\", "é", "?é", "[é-ü]", "*é*", "[^é]", "*?", "?*", "*[/]*", "a**b",
	"*x*y*z", "web_*", "mcp/*/read", "*_tool_0*", "*.go", "[a]", "[^/]*",
}

var globNames = []string{
	"", "a", "b", "ab", "abc", "a/b", "a/b/c", "/", "//", "aXb", "abXbc", "*", "?", "[", "]", "-", "\\",
	"a\\b", "é", "aé", "éa", "ü", "\xff", "a\xffb", "x/y", "xyz", "axbyc", "web_search", "web_", "mcp/fs/read",
	"fs_tool_final", "main.go", "dir/main.go", "a*b", "a?c", "abcabc", "zzz",
}

func checkGlob(t *testing.T, pattern, name string) {
	if validGlob(pattern) != nil {
		return
	}
	want, err := path.Match(pattern, name)
	if err != nil {
		t.Fatalf("path.Match(%q, %q) erred on a valid pattern: %v", pattern, name, err)
	}
	g := newGlob(pattern)
	// Byte equality is a match by docs/protocol/governance.md §2.4 even when path.Match disagrees.
	want = want || pattern == name
	if got := g.match(name); got != want {
		t.Fatalf("glob %q on %q: got %v, want %v", pattern, name, got, want)
	}
}

func TestGlobAgreesWithPathMatch(t *testing.T) {
	for _, p := range globSeeds {
		if validGlob(p) != nil {
			t.Errorf("seed %q is not a valid pattern", p)
		}
		for _, n := range globNames {
			checkGlob(t, p, n)
		}
	}
	// Random patterns and names over a small alphabet, where the
	// interesting interactions are likely.
	rng := rand.New(rand.NewPCG(1, 2))
	const patAlphabet = "ab/*?[]^-\\é"
	const nameAlphabet = "ab/*é-"
	pick := func(alphabet string, max int) string {
		rs := []rune(alphabet)
		out := make([]rune, rng.IntN(max+1))
		for i := range out {
			out[i] = rs[rng.IntN(len(rs))]
		}
		return string(out)
	}
	for range 200000 {
		checkGlob(t, pick(patAlphabet, 8), pick(nameAlphabet, 8))
	}
}

func FuzzGlob(f *testing.F) {
	for _, p := range globSeeds {
		for _, n := range globNames[:8] {
			f.Add(p, n)
		}
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		checkGlob(t, pattern, name)
	})
}
