// Package docsrefs_test keeps the repository's citations openable: code, tests and docs cite the
// wire reference as `docs/protocol/<file>.md §<n>`, and every such citation must name a file and a
// section that exist. Documents that live outside the repository must not be cited at all.
package docsrefs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// protocolDir is the wire reference; this test's own folder names the forbidden documents.
const (
	protocolDir = "docs/protocol/"
	selfDir     = "tests/docsrefs/"
)

var (
	// A citation and the same-file sections that may follow it:
	// "docs/protocol/steps.md §2", "docs/protocol/forks.md §2–§3, §5".
	section  = `§(\d+(?:\.\d+)*)(?:–§(\d+(?:\.\d+)*))?`
	citation = regexp.MustCompile(`docs/protocol/([A-Za-z0-9_-]+\.md) ` + section +
		`((?:(?:, | and |, and | or )` + section + `)*)`)
	nextSection = regexp.MustCompile(section)
	// A reference file named without a section.
	fileMention = regexp.MustCompile(`docs/protocol/([A-Za-z0-9_-]+\.md)`)
	sectionSign = regexp.MustCompile(`§`)
	heading     = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(\d+(?:\.\d+)*)\.?[ \t]`)
	// Inside docs/protocol: "[steps.md §2](steps.md)" and "[steps.md](steps.md)".
	localCitation = regexp.MustCompile(`\[([A-Za-z0-9_-]+\.md) §(\d+(?:\.\d+)*)\]\(([A-Za-z0-9_-]+\.md)\)`)
	localLink     = regexp.MustCompile(`\]\(([A-Za-z0-9_-]+\.md)(?:#[^)]*)?\)`)
)

// outside are documents a reader of this repository cannot open. The names are split so that
// this file does not cite them itself.
var outside = []struct {
	rx   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`PROTO` + `COL\.md`), "the out-of-repo protocol spec"},
	{regexp.MustCompile(`\bPROTO` + `COL\s*(?://+|#+|\*)?\s*§`), "the out-of-repo protocol spec"},
	{regexp.MustCompile(`RESOURCES-AND-` + `FORKS`), "the out-of-repo resources-and-forks spec"},
	{regexp.MustCompile(`Appendix ` + `A\b`), "an appendix of the out-of-repo spec"},
	{regexp.MustCompile(`\.\./` + `shared/|/work/` + `shared\b|shared/` + `spec/`), "a file outside the repository"},
}

func TestCitationsPointIntoTheRepository(t *testing.T) {
	root := repoRoot(t)
	sections := referenceSections(t, root)
	var problems []string
	report := func(file string, text []byte, at int, format string, args ...any) {
		line := bytes.Count(text[:at], []byte("\n")) + 1
		problems = append(problems, fmt.Sprintf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
	}
	checkSection := func(file string, text []byte, at int, ref, sec string) {
		have, ok := sections[ref]
		switch {
		case !ok:
			report(file, text, at, "cites docs/protocol/%s, which does not exist", ref)
		case sec != "" && !have[sec]:
			report(file, text, at, "cites docs/protocol/%s §%s, which has no such section", ref, sec)
		}
	}

	for _, file := range trackedFiles(t, root) {
		if strings.HasPrefix(file, protocolDir) || strings.HasPrefix(file, selfDir) {
			continue
		}
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted in the work tree, still in the index
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(text, 0) >= 0 {
			continue // binary
		}
		for _, o := range outside {
			for _, loc := range o.rx.FindAllIndex(text, -1) {
				report(file, text, loc[0], "cites %s (%q); cite docs/protocol/ instead", o.what, text[loc[0]:loc[1]])
			}
		}
		var covered [][]int
		for _, m := range citation.FindAllSubmatchIndex(text, -1) {
			covered = append(covered, m[:2])
			ref := string(text[m[2]:m[3]])
			checkSection(file, text, m[0], ref, string(text[m[4]:m[5]]))
			if m[6] >= 0 {
				checkSection(file, text, m[0], ref, string(text[m[6]:m[7]]))
			}
			if m[8] >= 0 {
				for _, n := range nextSection.FindAllSubmatch(text[m[8]:m[9]], -1) {
					checkSection(file, text, m[0], ref, string(n[1]))
					if len(n[2]) > 0 {
						checkSection(file, text, m[0], ref, string(n[2]))
					}
				}
			}
		}
		for _, m := range fileMention.FindAllSubmatchIndex(text, -1) {
			if !inside(covered, m[0]) {
				checkSection(file, text, m[0], string(text[m[2]:m[3]]), "")
			}
		}
		for _, loc := range sectionSign.FindAllIndex(text, -1) {
			if !inside(covered, loc[0]) {
				report(file, text, loc[0], "a section sign outside a docs/protocol/<file>.md §<n> citation")
			}
		}
	}

	// The reference's own cross-references.
	for ref := range sections {
		file := protocolDir + ref
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range localCitation.FindAllSubmatchIndex(text, -1) {
			named, target := string(text[m[2]:m[3]]), string(text[m[6]:m[7]])
			if named != target {
				report(file, text, m[0], "link text names %s but the link opens %s", named, target)
			}
			checkSection(file, text, m[0], target, string(text[m[4]:m[5]]))
		}
		for _, m := range localLink.FindAllSubmatchIndex(text, -1) {
			checkSection(file, text, m[0], string(text[m[2]:m[3]]), "")
		}
	}

	for _, p := range problems {
		t.Error(p)
	}
}

// TestCitationGrammar pins what the scan above accepts and refuses, so that a change to its
// patterns cannot silently stop it from checking anything.
func TestCitationGrammar(t *testing.T) {
	for _, tc := range []struct {
		text     string
		sections []string
	}{
		{"see docs/protocol/steps.md §2.", []string{"2"}},
		{"(docs/protocol/forks.md §2–§3, §5)", []string{"2", "3", "5"}},
		{"docs/protocol/governance.md §2.3 rule 8", []string{"2.3"}},
		{"docs/protocol/sdk.md §1, and §2", []string{"1", "2"}},
	} {
		m := citation.FindStringSubmatch(tc.text)
		if m == nil {
			t.Errorf("%q: no citation found", tc.text)
			continue
		}
		got := []string{m[2]}
		if m[3] != "" {
			got = append(got, m[3])
		}
		for _, n := range nextSection.FindAllStringSubmatch(m[4], -1) {
			got = append(got, n[1])
			if n[2] != "" {
				got = append(got, n[2])
			}
		}
		if strings.Join(got, " ") != strings.Join(tc.sections, " ") {
			t.Errorf("%q: sections %v, want %v", tc.text, got, tc.sections)
		}
	}
	for _, text := range []string{"PROTO" + "COL.md §3", "PROTO" + "COL §3.6", "RESOURCES-AND-" + "FORKS §5", "../" + "shared/spec/x.md"} {
		found := false
		for _, o := range outside {
			found = found || o.rx.MatchString(text)
		}
		if !found {
			t.Errorf("%q is not recognised as a citation of an outside document", text)
		}
	}
	if m := citation.FindStringIndex("a bare §3.4 here"); m != nil {
		t.Errorf("a bare section sign was taken for a citation")
	}
}

// referenceSections reads the numbered headings of every file of docs/protocol.
func referenceSections(t *testing.T, root string) map[string]map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, protocolDir))
	if err != nil {
		t.Fatalf("the wire reference is missing: %v", err)
	}
	out := map[string]map[string]bool{}
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".md" {
			continue
		}
		text, err := os.ReadFile(filepath.Join(root, protocolDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]bool{}
		for _, m := range heading.FindAllSubmatch(text, -1) {
			set[string(m[1])] = true
		}
		out[e.Name()] = set
	}
	if len(out["README.md"]) == 0 {
		t.Fatalf("docs/protocol/README.md has no numbered sections")
	}
	return out
}

// trackedFiles lists the files git tracks, or every file when git is unavailable.
func trackedFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f != "" {
				files = append(files, f)
			}
		}
		return files
	}
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".venv", "node_modules", "bin", "__pycache__":
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

func inside(spans [][]int, at int) bool {
	for _, s := range spans {
		if s[0] <= at && at < s[1] {
			return true
		}
	}
	return false
}
