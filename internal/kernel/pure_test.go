package kernel

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/rebuno/rebuno/internal/wire"
)

// uuidMillis is the 48-bit timestamp of a UUIDv7.
func uuidMillis(t *testing.T, id string) int64 {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Fatalf("%q is not a UUID: %v", id, err)
	}
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("%s is version %d variant %v, want a v7 RFC 4122 UUID", id, u.Version(), u.Variant())
	}
	if id != strings.ToLower(id) {
		t.Fatalf("%s is not lowercase", id)
	}
	return int64(binary.BigEndian.Uint64(append([]byte{0, 0}, u[:6]...)))
}

func TestNewDispatchID(t *testing.T) {
	now := t0.Add(123 * time.Millisecond)
	first := newDispatchID("", now)
	if ms := uuidMillis(t, first); ms != now.UnixMilli() {
		t.Fatalf("first id carries %d ms, want the clock's %d", ms, now.UnixMilli())
	}

	t.Run("later clock uses the clock", func(t *testing.T) {
		next := newDispatchID(first, now.Add(time.Second))
		if next <= first {
			t.Fatalf("%s is not greater than %s", next, first)
		}
		if ms := uuidMillis(t, next); ms != now.Add(time.Second).UnixMilli() {
			t.Fatalf("id carries %d ms, want %d", ms, now.Add(time.Second).UnixMilli())
		}
	})
	t.Run("same millisecond", func(t *testing.T) {
		next := newDispatchID(first, now)
		if next <= first {
			t.Fatalf("%s is not greater than %s", next, first)
		}
		if ms := uuidMillis(t, next); ms != now.UnixMilli()+1 {
			t.Fatalf("id carries %d ms, want previous + 1 = %d", ms, now.UnixMilli()+1)
		}
	})
	t.Run("clock went backwards", func(t *testing.T) {
		next := newDispatchID(first, now.Add(-time.Hour))
		if next <= first {
			t.Fatalf("%s is not greater than %s", next, first)
		}
		if ms := uuidMillis(t, next); ms != now.UnixMilli()+1 {
			t.Fatalf("id carries %d ms, want previous + 1 = %d", ms, now.UnixMilli()+1)
		}
	})
	t.Run("previous id in the future", func(t *testing.T) {
		future := newDispatchID("", now.Add(48*time.Hour))
		next := newDispatchID(future, now)
		if next <= future {
			t.Fatalf("%s is not greater than the future id %s", next, future)
		}
		if ms := uuidMillis(t, next); ms != now.Add(48*time.Hour).UnixMilli()+1 {
			t.Fatalf("id carries %d ms, want the future id's + 1", ms)
		}
	})
	t.Run("previous id at the top of its millisecond", func(t *testing.T) {
		// Random bits cannot make the new id smaller: it moves to the next
		// millisecond.
		u := uuid.MustParse(first)
		for i := 6; i < 16; i++ {
			u[i] = 0xff
		}
		u[6], u[8] = 0x7f, 0xbf
		prev := u.String()
		next := newDispatchID(prev, now)
		if next <= prev {
			t.Fatalf("%s is not greater than %s", next, prev)
		}
	})
	t.Run("unparsable previous id is ignored", func(t *testing.T) {
		// Only the clock counts (the id may move one millisecond on to stay
		// above the unparsable text).
		next := newDispatchID("not-a-uuid", now)
		if ms := uuidMillis(t, next); ms != now.UnixMilli() && ms != now.UnixMilli()+1 {
			t.Fatalf("id carries %d ms, want the clock's %d", ms, now.UnixMilli())
		}
	})
	t.Run("random walk of the clock", func(t *testing.T) {
		prev := ""
		clockAt := now
		for i := 0; i < 2000; i++ {
			// Jumps of -3 s … +3 s, often zero.
			clockAt = clockAt.Add(time.Duration((i*7919)%7-3) * time.Second)
			next := newDispatchID(prev, clockAt)
			if next <= prev {
				t.Fatalf("step %d: %s is not greater than %s", i, next, prev)
			}
			uuidMillis(t, next)
			prev = next
		}
	})
}

func TestNewIDIsV7(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		id := newID()
		uuidMillis(t, id)
		if seen[id] {
			t.Fatalf("newID repeated %s", id)
		}
		seen[id] = true
	}
}

func TestRetryDelay(t *testing.T) {
	k := &Kernel{cfg: Config{BackoffBase: time.Second, BackoffMax: 30 * time.Second}}
	cases := []struct {
		n    int64
		base time.Duration // d of docs/protocol/dispatch.md §6; the delay is in [d, d + d/4)
	}{
		{0, time.Second}, // after an attempt that made progress: starts again at base
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{4, 8 * time.Second},
		{5, 16 * time.Second},
		{6, 30 * time.Second}, // 32 s capped
		{7, 30 * time.Second},
		{64, 30 * time.Second},
		{1 << 40, 30 * time.Second}, // no overflow for absurd attempt counts
	}
	for _, tc := range cases {
		lo, hi := tc.base, tc.base+tc.base/4
		var minSeen, maxSeen time.Duration = hi, 0
		for i := 0; i < 400; i++ {
			d := k.retryDelay(tc.n)
			if d < lo || d >= hi {
				t.Fatalf("retryDelay(%d) = %v, want in [%v, %v)", tc.n, d, lo, hi)
			}
			minSeen, maxSeen = min(minSeen, d), max(maxSeen, d)
		}
		// The jitter is random, not a constant offset.
		if maxSeen-minSeen < tc.base/20 {
			t.Fatalf("retryDelay(%d) ranged only over [%v, %v] in 400 draws", tc.n, minSeen, maxSeen)
		}
	}

	t.Run("custom base and cap", func(t *testing.T) {
		k := &Kernel{cfg: Config{BackoffBase: 100 * time.Millisecond, BackoffMax: 350 * time.Millisecond}}
		for n, want := range map[int64]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 350 * time.Millisecond, 9: 350 * time.Millisecond} {
			if d := k.retryDelay(n); d < want || d >= want+want/4 {
				t.Fatalf("retryDelay(%d) = %v, want in [%v, %v)", n, d, want, want+want/4)
			}
		}
	})
	t.Run("base equal to max", func(t *testing.T) {
		k := &Kernel{cfg: Config{BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Second}}
		for _, n := range []int64{1, 2, 10} {
			if d := k.retryDelay(n); d < 5*time.Second || d >= 5*time.Second+5*time.Second/4 {
				t.Fatalf("retryDelay(%d) = %v", n, d)
			}
		}
	})
	t.Run("tiny base has no jitter", func(t *testing.T) {
		k := &Kernel{cfg: Config{BackoffBase: 3, BackoffMax: 3}}
		if d := k.retryDelay(1); d != 3 {
			t.Fatalf("retryDelay(1) = %v, want exactly 3ns (d/4 rounds to 0)", d)
		}
	})
}

func TestTruncateUTF8(t *testing.T) {
	cases := []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 10, "hello"},
		{"hello", 5, "hello"},
		{"hello", 3, "hel"},
		{"hello", 0, ""},
		{"", 4, ""},
		{"aé", 3, "aé"},   // é is 2 bytes
		{"aé", 2, "a"},    // would split é
		{"aé", 1, "a"},    // boundary
		{"€uro", 1, ""},   // € is 3 bytes
		{"€uro", 2, ""},   // inside €
		{"€uro", 3, "€"},  // right after €
		{"€uro", 4, "€u"}, // ASCII after it
		{"x😀y", 4, "x"},   // 4-byte emoji
		{"x😀y", 5, "x😀"},
		{"😀😀", 7, "😀"},
	}
	for _, tc := range cases {
		got := TruncateUTF8(tc.s, tc.n)
		if got != tc.want {
			t.Errorf("TruncateUTF8(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
	// Exhaustive over a mixed string: always valid, within n, and maximal.
	s := "aé€😀b" + strings.Repeat("ß", 5) + "😀"
	for n := 0; n <= len(s)+1; n++ {
		got := TruncateUTF8(s, n)
		if !utf8.ValidString(got) || len(got) > n || !strings.HasPrefix(s, got) {
			t.Fatalf("TruncateUTF8(s, %d) = %q is not a valid prefix within %d bytes", n, got, n)
		}
		if len(got) < n && len(got) < len(s) {
			_, size := utf8.DecodeRuneInString(s[len(got):])
			if len(got)+size <= n {
				t.Fatalf("TruncateUTF8(s, %d) = %q cut more than the character at the boundary", n, got)
			}
		}
	}
}

func TestValidAgentID(t *testing.T) {
	good := []string{"a", "A", "0", "researcher", "my-agent_1.v2", "a" + strings.Repeat("b", 127), "9lives", "x.", "x-", "x_"}
	bad := []string{"", "-a", ".a", "_a", "a b", "a/b", "é", "a" + strings.Repeat("b", 128), "a\n", "a:b", "agent@host"}
	for _, id := range good {
		if !ValidAgentID(id) {
			t.Errorf("ValidAgentID(%q) = false, want true", id)
		}
	}
	for _, id := range bad {
		if ValidAgentID(id) {
			t.Errorf("ValidAgentID(%q) = true, want false", id)
		}
	}
}

func TestValidResourceKey(t *testing.T) {
	good := []string{"workspace", "a", "A.b-c_d", "...", ".a", "-", "_", "0", strings.Repeat("k", 128), ".hidden"}
	bad := []string{"", ".", "..", "a b", "a/b", "é", strings.Repeat("k", 129), "a\x00", "a:b"}
	for _, k := range good {
		if !ValidResourceKey(k) {
			t.Errorf("ValidResourceKey(%q) = false, want true", k)
		}
	}
	for _, k := range bad {
		if ValidResourceKey(k) {
			t.Errorf("ValidResourceKey(%q) = true, want false", k)
		}
	}
}

func TestValidIdempotencyKey(t *testing.T) {
	good := []string{"k", "!", "~", "order-42/retry#1", strings.Repeat("x", 128), `{"quoted":1}`}
	bad := []string{"", " ", "a b", "tab\t", "del\x7f", "nul\x00", "é", strings.Repeat("x", 129), "line\n"}
	for _, k := range good {
		if err := ValidIdempotencyKey(k); err != nil {
			t.Errorf("ValidIdempotencyKey(%q) = %v, want nil", k, err)
		}
	}
	for _, k := range bad {
		err := ValidIdempotencyKey(k)
		if ke := wantCode(t, err, wire.CodeValidation); ke.Field != "idempotency_key" {
			t.Errorf("ValidIdempotencyKey(%q) names field %q", k, ke.Field)
		}
	}
}

func TestValidateSubmit(t *testing.T) {
	keys := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "k" + strings.Repeat("x", i)
		}
		return out
	}
	bad := []struct {
		name  string
		r     SubmitRequest
		field string
	}{
		{"missing kind", SubmitRequest{}, "kind"},
		{"unknown kind", SubmitRequest{Kind: "shell"}, "kind"},
		{"target too long", SubmitRequest{Kind: wire.KindToolCall, Target: strings.Repeat("t", 1025)}, "target"},
		{"target with NUL", SubmitRequest{Kind: wire.KindToolCall, Target: "a\x00b"}, "target"},
		{"target with LF", SubmitRequest{Kind: wire.KindToolCall, Target: "a\nb"}, "target"},
		{"target with DEL", SubmitRequest{Kind: wire.KindToolCall, Target: "a\x7f"}, "target"},
		{"target with unit separator", SubmitRequest{Kind: wire.KindLocal, Target: "a\x1f"}, "target"},
		{"unknown idempotency", SubmitRequest{Kind: wire.KindToolCall, Idempotency: "maybe"}, "idempotency"},
		{"resources on llm_call", SubmitRequest{Kind: wire.KindLLMCall, Resources: []string{"w"}}, "resources"},
		{"malformed resource key", SubmitRequest{Kind: wire.KindToolCall, Resources: []string{"a b"}}, "resources"},
		{"dot resource key", SubmitRequest{Kind: wire.KindLocal, Resources: []string{".."}}, "resources"},
		{"33 resource keys", SubmitRequest{Kind: wire.KindToolCall, Resources: keys(33)}, "resources"},
		{"negative occurrence", SubmitRequest{Kind: wire.KindToolCall, Occurrence: -1, HasOccurrence: true}, wire.HeaderStepOccurrence},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			if ke := wantCode(t, validateSubmit(&r), wire.CodeValidation); ke.Field != tc.field {
				t.Fatalf("field = %q, want %q", ke.Field, tc.field)
			}
		})
	}

	t.Run("accepted values", func(t *testing.T) {
		r := SubmitRequest{Kind: wire.KindToolCall, Target: strings.Repeat("t", 1024) + ""}
		r.Target = r.Target[:1024]
		if err := validateSubmit(&r); err != nil {
			t.Fatalf("a 1,024-byte target: %v", err)
		}
		if r.Idempotency != wire.SafeToRetry {
			t.Fatalf("empty idempotency became %q, want safe_to_retry", r.Idempotency)
		}
		r = SubmitRequest{Kind: wire.KindLLMCall, Target: "gpt-4o é", Idempotency: wire.AtMostOnce, Resources: []string{}}
		if err := validateSubmit(&r); err != nil || r.Idempotency != wire.AtMostOnce {
			t.Fatalf("llm_call with [] resources: %v (%q)", err, r.Idempotency)
		}
		// Repeated keys are dropped keeping the first; 32 distinct keys plus
		// repeats are within the limit.
		in := append(keys(32), "kxx", "k", "kx")
		r = SubmitRequest{Kind: wire.KindLocal, Resources: in}
		if err := validateSubmit(&r); err != nil {
			t.Fatalf("32 distinct keys with repeats: %v", err)
		}
		if !slices.Equal(r.Resources, keys(32)) {
			t.Fatalf("deduplicated resources = %v", r.Resources)
		}
		if len(in) != 35 || in[32] != "kxx" {
			t.Fatal("validateSubmit modified the caller's slice")
		}
		r = SubmitRequest{Kind: wire.KindToolCall, Occurrence: 0, HasOccurrence: true}
		if err := validateSubmit(&r); err != nil {
			t.Fatalf("occurrence 0: %v", err)
		}
	})
}

func TestStepStatusFilter(t *testing.T) {
	terminal := []string{wire.StepSucceeded, wire.StepFailed, wire.StepDenied, wire.StepCancelled}
	cases := map[string][]string{
		"":         nil,
		"terminal": terminal,
		"pending":  {wire.StepProposed, wire.StepAllowed, wire.StepAwaitingApproval, wire.StepExecuting},
	}
	for _, s := range wire.StepStatuses {
		cases[s] = []string{s}
	}
	for filter, want := range cases {
		got, err := StepStatusFilter(filter)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("StepStatusFilter(%q) = %v, %v; want %v", filter, got, err, want)
		}
	}
	// terminal and pending partition the eight statuses.
	pend, _ := StepStatusFilter("pending")
	all := append(append([]string{}, terminal...), pend...)
	slices.Sort(all)
	st := slices.Clone(wire.StepStatuses)
	slices.Sort(st)
	if !slices.Equal(all, st) {
		t.Fatalf("terminal ∪ pending = %v, want every status", all)
	}
	for _, bad := range []string{"running", "TERMINAL", "done", " pending"} {
		_, err := StepStatusFilter(bad)
		if ke := wantCode(t, err, wire.CodeValidation); ke.Field != "status" {
			t.Errorf("StepStatusFilter(%q) field %q", bad, ke.Field)
		}
	}
}

func TestErrorHelpers(t *testing.T) {
	e := Validation("limit", "limit must be %d", 5)
	if e.Code != wire.CodeValidation || e.Field != "limit" || e.Message != "validation error: limit must be 5" || e.Error() != e.Message {
		t.Fatalf("Validation() = %+v", e)
	}
	for _, tc := range []struct {
		err  *Error
		code string
		msg  string
	}{
		{errNotFound("agent"), wire.CodeNotFound, "agent not found"},
		{errForbidden(), wire.CodeForbidden, "forbidden"},
		{errConflict("x"), wire.CodeConflict, "conflict: x"},
		{errTerminal(), wire.CodeExecutionTerminal, "execution terminal"},
		{errSuperseded(), wire.CodeLeaseSuperseded, "lease superseded"},
	} {
		if tc.err.Code != tc.code || tc.err.Message != tc.msg {
			t.Errorf("got %+v, want %s %q", tc.err, tc.code, tc.msg)
		}
	}
}

func TestRewriteStepID(t *testing.T) {
	ids := map[string]string{"aaaa": "bbbb", "short": "a-longer-id", "x": "y"}
	cases := []struct{ in, want string }{
		{`{"rule_id":"r","step_id":"aaaa","target":"t"}`, `{"rule_id":"r","step_id":"bbbb","target":"t"}`},
		{`{"step_id":"short","target":"t"}`, `{"step_id":"a-longer-id","target":"t"}`},
		{`{"a":{"step_id":"x"},"step_id":"x"}`, `{"a":{"step_id":"x"},"step_id":"y"}`}, // only the top-level member
		{`{"step_id":"unknown"}`, `{"step_id":"unknown"}`},
		{`{"target":"t"}`, `{"target":"t"}`},
		{`{"step_id":7}`, `{"step_id":7}`},
	}
	for _, c := range cases {
		if got := string(rewriteStepID([]byte(c.in), ids)); got != c.want {
			t.Errorf("rewriteStepID(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}
