package cli_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// closedURL is a loopback URL where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

type errCase struct {
	name   string
	env    []string
	args   []string
	code   int
	stderr []string // substrings, in order
}

func checkCases(t *testing.T, cases []errCase) {
	t.Helper()
	for _, c := range cases {
		r := run(t, c.env, c.args...)
		if r.Code != c.code {
			t.Errorf("%s: rebuno %s: want exit %d, got %s", c.name, strings.Join(c.args, " "), c.code, r)
			continue
		}
		rest := r.Stderr
		for _, want := range c.stderr {
			i := strings.Index(rest, want)
			if i < 0 {
				t.Errorf("%s: stderr lacks %q:\n%s", c.name, want, r.Stderr)
				break
			}
			rest = rest[i+len(want):]
		}
		if r.Stdout != "" && c.code != 0 {
			t.Errorf("%s: an error wrote to stdout: %q", c.name, r.Stdout)
		}
	}
}

// TestErrorMessagesAndExitCodes covers every error class of docs/protocol/configuration.md §6.2 with a
// message a person can act on: 1 kernel error (`error: <code>: <message>`
// plus a hint), 2 usage, 3 unreachable.
func TestErrorMessagesAndExitCodes(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	url := []string{"REBUNO_URL=" + k.URL}
	running := k.CreateExecution("researcher", `{}`)
	wh := a.NextWebhook()
	done := k.CreateExecution("researcher", `{}`)
	a.NextWebhook()
	a.Finish(running, kt.LeaseOf(wh), `null`)
	running, done = done, running // `running` is still running; `done` completed
	down := closedURL(t)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>hello</html>")) }))
	defer web.Close()

	checkCases(t, []errCase{
		{"unreachable", []string{"REBUNO_URL=" + down}, []string{"exec", "ls"}, 3,
			[]string{"error: cannot reach the kernel at " + down + ": connection refused", "hint: start a kernel with `rebuno dev`"}},
		{"unreachable by flag", nil, []string{"agent", "ls", "--url", down}, 3, []string{"cannot reach the kernel"}},
		{"default URL named", []string{"REBUNO_URL="}, []string{"exec", "get", running, "--url", down}, 3, []string{down}},
		{"bad URL", nil, []string{"exec", "ls", "--url", "localhost:8080"}, 2, []string{`invalid kernel URL "localhost:8080"`}},
		{"not a kernel", []string{"REBUNO_URL=" + web.URL}, []string{"exec", "ls"}, 1,
			[]string{"error: bad_response: unexpected answer to /v0/executions: HTTP 200", "hint: is " + web.URL + " a Rebuno kernel?"}},
		{"URL with a path", []string{"REBUNO_URL=" + k.URL + "/v0"}, []string{"agent", "ls"}, 1,
			[]string{"error: not_found: route not found", "hint: the kernel has no such route: check that --url / REBUNO_URL is the kernel's base URL"}},

		{"unknown execution", url, []string{"exec", "get", "01234567-89ab-7def-8123-456789abcdef"}, 1,
			[]string{"error: not_found: execution not found"}},
		{"unknown suffix", url, []string{"exec", "watch", "abcdef"}, 1,
			[]string{`error: not_found: no execution id ends with "abcdef" among the newest 200 executions`}},
		{"bad id", url, []string{"exec", "get", "xyz"}, 2, []string{`invalid execution id "xyz"`, "Run 'rebuno exec get --help' for usage."}},
		{"too short id", url, []string{"exec", "cancel", "12345"}, 2, []string{`invalid execution id "12345"`}},
		{"unknown agent", url, []string{"exec", "create", "nobody"}, 1,
			[]string{"error: not_found: agent not found", "hint: no agent \"nobody\" is registered; `rebuno agent ls` lists them"}},
		{"input not JSON", url, []string{"exec", "create", "researcher", "{topic: x}"}, 2, []string{"the input is not valid JSON"}},
		{"missing input file", url, []string{"exec", "create", "researcher", "@/nonexistent/in.json"}, 2, []string{"read /nonexistent/in.json"}},
		{"empty stdin", url, []string{"exec", "create", "researcher", "-"}, 2, []string{"the standard input is empty"}},
		{"cancel finished", url, []string{"exec", "cancel", done}, 1,
			[]string{"error: execution_terminal: execution terminal", "hint: the execution has already ended"}},
		{"rm busy agent", url, []string{"agent", "rm", "researcher"}, 1,
			[]string{"error: conflict: ", "hint: the agent has executions that have not ended"}},
		{"rm unknown agent", url, []string{"agent", "rm", "nobody"}, 1, []string{"error: not_found: ", "hint: `rebuno agent ls`"}},
		{"bad agent", url, []string{"agent", "add", "--id", "x", "--webhook-url", "ftp://h/", "--secret", "s"}, 1,
			[]string{"error: validation_error: "}},
		{"agent add missing", url, []string{"agent", "add", "--id", "x"}, 2, []string{"missing --webhook-url, --secret"}},
		{"agent add both", url, []string{"agent", "add", "m.yaml", "--id", "x"}, 2, []string{"not both"}},

		{"no args", url, []string{"exec", "get"}, 2, []string{"rebuno exec get takes 1 argument (id), got 0"}},
		{"too many args", url, []string{"exec", "ls", "extra"}, 2, []string{"takes 0 arguments"}},
		{"unknown flag", url, []string{"exec", "ls", "--bogus"}, 2, []string{"unknown flag: --bogus", "Run 'rebuno exec ls --help'"}},
		{"unknown verb", url, []string{"exec", "lst"}, 2, []string{`unknown command "lst" for "rebuno exec"; did you mean `, " ls?"}},
		{"bad status", url, []string{"exec", "ls", "--status", "done"}, 2, []string{`invalid --status "done"`}},
		{"bad limit", url, []string{"exec", "ls", "--limit", "500"}, 2, []string{"invalid --limit 500"}},
		{"bad after-seq", url, []string{"exec", "events", running, "--after-seq", "-1"}, 2, []string{"invalid --after-seq"}},
		{"bad timeout", url, []string{"exec", "ls", "--timeout", "soon"}, 2, []string{"invalid argument"}},
	})
	// Group commands without a verb print their help.
	if r := run(t, url, "exec"); r.Code != 0 || !strings.Contains(r.Stdout, "Available Commands") {
		t.Fatalf("exec help: %s", r)
	}
	// The stdin case again, with input: not an error.
	if r := runIn(t, `{"ok":true}`, url, "exec", "create", "researcher", "-"); r.Code != 0 {
		t.Fatalf("stdin: %s", r)
	}
}

// TestAuthErrors: with a bearer token on the kernel, a missing or wrong
// token says which setting to fix; both variables are honoured.
func TestAuthErrors(t *testing.T) {
	k := kt.Start(t, kt.Options{Token: "sesame-0123456789"})
	url := "REBUNO_URL=" + k.URL
	checkCases(t, []errCase{
		{"no token", []string{url}, []string{"exec", "ls"}, 1,
			[]string{"error: unauthorized: unauthorized", "hint: this kernel requires a bearer token: pass --token or set REBUNO_API_KEY"}},
		{"wrong API key", []string{url, "REBUNO_API_KEY=wrong"}, []string{"agent", "ls"}, 1,
			[]string{"error: unauthorized: unauthorized", "hint: the kernel refused the token from REBUNO_API_KEY"}},
		{"wrong flag", []string{url, "REBUNO_API_KEY=sesame-0123456789"}, []string{"agent", "ls", "--token", "nope"}, 1,
			[]string{"the kernel refused the token from --token"}},
		{"API key wins", []string{url, "REBUNO_API_KEY=nope", "REBUNO_BEARER_TOKEN=sesame-0123456789"}, []string{"exec", "ls"}, 1,
			[]string{"refused the token from REBUNO_API_KEY"}},
		{"API key", []string{url, "REBUNO_API_KEY=sesame-0123456789"}, []string{"exec", "ls"}, 0, nil},
		{"bearer token", []string{url, "REBUNO_BEARER_TOKEN=sesame-0123456789"}, []string{"agent", "ls"}, 0, nil},
		{"flag", []string{url}, []string{"exec", "ls", "--token", "sesame-0123456789"}, 0, nil},
	})
}
