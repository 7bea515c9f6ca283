package wire

import (
	"testing"
	"time"
)

func TestFormatTime(t *testing.T) {
	plus2 := time.FixedZone("UTC+2", 2*60*60)
	minus530 := time.FixedZone("UTC-5:30", -(5*60*60 + 30*60))
	cases := []struct {
		name string
		in   time.Time
		want string
	}{
		{"spec example, microseconds", time.Date(2026, 12, 2, 9, 37, 43, 629821000, time.UTC), "2026-12-02T09:37:43.629821Z"},
		{"whole second has no fraction", time.Date(2026, 12, 2, 9, 37, 43, 0, time.UTC), "2026-12-02T09:37:43Z"},
		{"tenths", time.Date(2026, 1, 2, 3, 4, 5, 100000000, time.UTC), "2026-01-02T03:04:05.1Z"},
		{"trailing zeros trimmed", time.Date(2026, 1, 2, 3, 4, 5, 120000000, time.UTC), "2026-01-02T03:04:05.12Z"},
		{"one nanosecond keeps nine digits", time.Date(2026, 1, 2, 3, 4, 5, 1, time.UTC), "2026-01-02T03:04:05.000000001Z"},
		{"ten nanoseconds", time.Date(2026, 1, 2, 3, 4, 5, 10, time.UTC), "2026-01-02T03:04:05.00000001Z"},
		{"all nine digits", time.Date(2026, 1, 2, 3, 4, 5, 987654321, time.UTC), "2026-01-02T03:04:05.987654321Z"},
		{"zero seconds, zero fraction", time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), "2026-01-02T03:04:00Z"},
		{"east of UTC converted", time.Date(2026, 12, 2, 11, 37, 43, 500000000, plus2), "2026-12-02T09:37:43.5Z"},
		{"west of UTC crosses midnight", time.Date(2026, 12, 31, 20, 0, 0, 0, minus530), "2027-01-01T01:30:00Z"},
		{"local zone converted", time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC).In(plus2), "2026-06-01T12:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := FormatTime(tc.in)
			if got != tc.want {
				t.Fatalf("FormatTime(%v) = %q, want %q", tc.in, got, tc.want)
			}
			back, err := time.Parse(time.RFC3339Nano, got)
			if err != nil {
				t.Fatalf("%q does not parse as RFC 3339: %v", got, err)
			}
			if !back.Equal(tc.in) {
				t.Fatalf("%q parses back as %v, want the instant %v", got, back, tc.in)
			}
		})
	}
}

func TestFormatTimeAlwaysZ(t *testing.T) {
	base := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("x", 3600))
	for ns := 0; ns < 1e9; ns += 37_123_457 {
		s := FormatTime(base.Add(time.Duration(ns)))
		if s[len(s)-1] != 'Z' {
			t.Fatalf("%q does not end in Z", s)
		}
		if s[len(s)-2] == '0' && len(s) > len("2026-03-04T04:06:07Z") {
			t.Fatalf("%q keeps a trailing zero in its fraction", s)
		}
		if s[len(s)-2] == '.' {
			t.Fatalf("%q has an empty fraction", s)
		}
	}
}

func TestStatusPredicates(t *testing.T) {
	for _, s := range ExecutionStatuses {
		want := s == ExecCompleted || s == ExecFailed || s == ExecCancelled
		if ExecTerminal(s) != want {
			t.Errorf("ExecTerminal(%q) = %v, want %v", s, !want, want)
		}
	}
	if ExecTerminal("") || ExecTerminal("done") {
		t.Error("ExecTerminal accepts a status that does not exist")
	}
	for _, s := range StepStatuses {
		want := s == StepSucceeded || s == StepFailed || s == StepDenied || s == StepCancelled
		if StepTerminal(s) != want {
			t.Errorf("StepTerminal(%q) = %v, want %v", s, !want, want)
		}
	}
	if len(ExecutionStatuses) != 6 || len(StepStatuses) != 8 {
		t.Errorf("status lists have %d and %d entries, want 6 and 8", len(ExecutionStatuses), len(StepStatuses))
	}
	for _, k := range []string{KindToolCall, KindLLMCall, KindLocal} {
		if !ValidKind(k) {
			t.Errorf("ValidKind(%q) = false", k)
		}
	}
	for _, k := range []string{"", "shell", "Tool_call", "tool_call "} {
		if ValidKind(k) {
			t.Errorf("ValidKind(%q) = true", k)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://hooks.example.com/a?b=c":          "https://hooks.example.com/a?b=c",
		"https://alice:s3cret@hooks.example.com/a": "https://alice:xxxxx@hooks.example.com/a",
		"https://tok_123@hooks.example.com/":       "https://xxxxx@hooks.example.com/",
		"http://u:@h/":                             "http://u:xxxxx@h/",
		"%zz":                                      "%zz",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
