package repl

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	for line, want := range map[string][]string{
		"":                               nil,
		"  exec   ls  ":                  {"exec", "ls"},
		`exec create a '{"q": "x y"}'`:   {"exec", "create", "a", `{"q": "x y"}`},
		`exec create a "{\"q\": \"x\"}"`: {"exec", "create", "a", `{"q": "x"}`},
		`agent add --secret a\ b`:        {"agent", "add", "--secret", "a b"},
		`exec create a ''`:               {"exec", "create", "a", ""},
		`x 'a'"b"c`:                      {"x", "abc"},
		"exec\tget\t0123456789ab":        {"exec", "get", "0123456789ab"},
		`exec create a "back\\slash"`:    {"exec", "create", "a", `back\slash`},
	} {
		got, err := Split(line)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Split(%q) = %q, %v; want %q", line, got, err, want)
		}
	}
	for _, bad := range []string{`exec create a '{`, `x "y`} {
		if _, err := Split(bad); err == nil {
			t.Errorf("Split(%q): no error", bad)
		}
	}
}

func fakeKernel(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v0/executions":
			fmt.Fprint(w, `{"executions":[{"id":"01a237ae-7cb5-73f2-81a0-1bce14b3cad6"},{"id":"01a237ae-7cb5-73f2-81a0-1bce99999999"}]}`)
		case "/v0/agents":
			fmt.Fprint(w, `[{"id":"coder"},{"id":"researcher"}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func complete(c *completer, line string) []string {
	cands, n := c.Do([]rune(line), len([]rune(line)))
	word := line[len(line)-n:]
	var out []string
	for _, s := range cands {
		out = append(out, word+string(s))
	}
	sort.Strings(out)
	return out
}

func TestCompletion(t *testing.T) {
	srv := fakeKernel(t)
	r := New(Options{URL: srv.URL, Out: &bytes.Buffer{}, Err: &bytes.Buffer{}, HistoryFile: "-"})
	c := r.comp
	for line, want := range map[string][]string{
		"ex":                  {"exec ", "execution ", "executions ", "exit "},
		"exec w":              {"watch "},
		"exec ":               {"cancel ", "coverage ", "create ", "events ", "fork ", "forks ", "get ", "list ", "ls ", "run ", "watch "},
		"agent r":             {"rm "},
		"exec get ":           {"14b3cad6 ", "99999999 "},
		"exec watch 9":        {"99999999 "},
		"exec coverage 1":     {"14b3cad6 "},
		"exec cancel --json ": {"14b3cad6 ", "99999999 "},
		"exec create r":       {"researcher "},
		"agents get c":        {"coder "},
		"exec get 14b3cad6 ":  nil,
		"exec ls --":          nil,
		"help ag":             {"agent ", "agents "},
	} {
		if got := complete(c, line); !reflect.DeepEqual(got, want) {
			t.Errorf("complete(%q) = %q, want %q", line, got, want)
		}
	}
}

// TestExecLines runs lines through the REPL without a terminal: help,
// unknown commands, quit, and a command's error with the REPL's spelling.
func TestExecLines(t *testing.T) {
	srv := fakeKernel(t)
	var out, errb bytes.Buffer
	r := New(Options{URL: srv.URL, Out: &out, Err: &errb, HistoryFile: "-"})
	if r.Exec("help") || !strings.Contains(out.String(), "exec watch <id>") {
		t.Fatalf("help: %q", out.String())
	}
	if r.Exec("nonsense here") || !strings.Contains(errb.String(), `unknown command "nonsense"`) {
		t.Fatalf("unknown: %q", errb.String())
	}
	errb.Reset()
	if r.Exec("exec get zz") || !strings.Contains(errb.String(), "Run 'exec get --help' for usage.") {
		t.Fatalf("usage error: %q", errb.String())
	}
	out.Reset()
	if r.Exec("agent ls") || !strings.Contains(out.String(), "researcher") {
		t.Fatalf("agent ls: %q", out.String())
	}
	if !r.Exec("quit") || !r.Exec("  exit ") {
		t.Fatal("quit/exit did not quit")
	}
}

// TestHistoryKeepsSecretsOut types a secret through the REPL's line editor:
// the history file is the user's alone, holds the other lines, and never the
// secret, and a history file left world-readable (by an older version) is
// tightened and purged of secret lines when the REPL opens it.
func TestHistoryKeepsSecretsOut(t *testing.T) {
	srv := fakeKernel(t)
	path := filepath.Join(t.TempDir(), HistoryName)
	old := "agent ls\nagent add --id x --webhook-url http://h/ --secret=leaked-long-ago\n"
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	in := io.NopCloser(strings.NewReader("agent add --id y --webhook-url http://h/ --secret typed-just-now\n" +
		"exec ls --token tok-123\nagent ls --json\nquit\n"))
	r := New(Options{URL: srv.URL, In: in, Out: &bytes.Buffer{}, Err: &bytes.Buffer{}, HistoryFile: path})
	if err := r.Run(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("history file mode %v, want 0600", st.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	got := string(b)
	for _, secret := range []string{"leaked-long-ago", "typed-just-now", "tok-123"} {
		if strings.Contains(got, secret) {
			t.Fatalf("history holds the secret %q:\n%s", secret, got)
		}
	}
	if want := "agent ls\nagent ls --json\nquit\n"; got != want {
		t.Fatalf("history = %q, want %q", got, want)
	}
}

func TestCarriesSecret(t *testing.T) {
	for line, want := range map[string]bool{
		"agent add --id a --webhook-url u --secret s": true,
		"agent add --secret=s":                        true,
		"exec ls --token t":                           true,
		"exec ls --bearer-token=t":                    true,
		"curl -H 'Authorization: Bearer t'":           true,
		"exec get abc":                                false,
		"agent add manifest.yaml":                     false,
		"exec create coder '{\"secretary\":1}'":       false,
	} {
		if got := carriesSecret(line); got != want {
			t.Errorf("carriesSecret(%q) = %v, want %v", line, got, want)
		}
	}
}
