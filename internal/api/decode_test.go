package api

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// validationField asserts err is a validation error and returns its field.
func validationField(t *testing.T, err error) string {
	t.Helper()
	var ke *kernel.Error
	if !errors.As(err, &ke) || ke.Code != wire.CodeValidation {
		t.Fatalf("error = %v, want a validation error", err)
	}
	return ke.Field
}

func TestParseUUID(t *testing.T) {
	good := map[string]string{
		"018ff0a0-0000-7000-8000-000000000001": "018ff0a0-0000-7000-8000-000000000001",
		"018FF0A0-ABCD-7EF0-8000-00000000000A": "018ff0a0-abcd-7ef0-8000-00000000000a",
		"018ff0A0-aBcD-7000-8000-0000000000Ff": "018ff0a0-abcd-7000-8000-0000000000ff",
		"00000000-0000-0000-0000-000000000000": "00000000-0000-0000-0000-000000000000",
	}
	for in, want := range good {
		got, err := parseUUID("id", in)
		if err != nil || got != want {
			t.Errorf("parseUUID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{
		"", "abc",
		"018ff0a0000070008000000000000001",              // 32 hex, no hyphens
		"{018ff0a0-0000-7000-8000-000000000001}",        // braces
		"urn:uuid:018ff0a0-0000-7000-8000-000000000001", // URN
		"018ff0a0-0000-7000-8000-00000000001",           // 35
		"018ff0a0-0000-7000-8000-0000000000011",         // 37
		"018ff0a00-000-7000-8000-000000000001",          // hyphen moved
		"018ff0a0-0000-70008-000-000000000001",          // hyphen moved
		"018ff0a0-0000-7000-8000_000000000001",          // wrong separator
		"018ff0g0-0000-7000-8000-000000000001",          // non-hex
		"018ff0a0-0000-7000-8000-00000000000 ",          // space
		"018ff0a0+0000-7000-8000-000000000001",
		"018ff0a0-0000-7000-8000-0000000000é",
	}
	for _, in := range bad {
		_, err := parseUUID("cursor", in)
		if f := validationField(t, err); f != "cursor" {
			t.Errorf("parseUUID(%q) field %q", in, f)
		}
	}
}

func TestValidStepID(t *testing.T) {
	ok := strings.Repeat("0123456789abcdef", 4)
	if !validStepID(ok) {
		t.Fatal("a valid step id was refused")
	}
	for _, bad := range []string{"", ok[:63], ok + "0", strings.ToUpper(ok), ok[:63] + "g", ok[:63] + "-"} {
		if validStepID(bad) {
			t.Errorf("validStepID(%q) = true", bad)
		}
	}
}

func TestParseInt(t *testing.T) {
	good := map[string]int64{"0": 0, "7": 7, "-5": -5, "007": 7, "9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63}
	for in, want := range good {
		if got, err := parseInt("limit", in); err != nil || got != want {
			t.Errorf("parseInt(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "-", "+5", "1.0", "1e3", " 5", "5 ", "abc", "0x10", "--1", "9223372036854775808", "-9223372036854775809", "١"} {
		_, err := parseInt("limit", in)
		if f := validationField(t, err); f != "limit" {
			t.Errorf("parseInt(%q) field %q", in, f)
		}
	}
}

func TestHeaderInt(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		lo   int64
		want int64
		ok   bool
	}{
		{[]string{"1"}, 1, 1, true},
		{[]string{"2147483647"}, 1, 2147483647, true},
		{[]string{"0"}, 0, 0, true},
		{[]string{"01"}, 1, 1, true},
		{[]string{"0"}, 1, 0, false},
		{[]string{"2147483648"}, 1, 0, false},
		{[]string{"9999999999"}, 0, 0, false},
		{[]string{"00000000001"}, 0, 0, false}, // 11 characters
		{[]string{"-1"}, 0, 0, false},
		{[]string{"+1"}, 0, 0, false},
		{[]string{"x"}, 0, 0, false},
		{[]string{""}, 0, 0, false},
		{[]string{"1.0"}, 0, 0, false},
		{[]string{"1", "1"}, 0, 0, false}, // repeated
	} {
		got, err := headerInt(wire.HeaderDispatchAttempt, tc.vals, tc.lo)
		if tc.ok {
			if err != nil || got != tc.want {
				t.Errorf("headerInt(%q, lo %d) = %d, %v; want %d", tc.vals, tc.lo, got, err, tc.want)
			}
			continue
		}
		if f := validationField(t, err); f != wire.HeaderDispatchAttempt {
			t.Errorf("headerInt(%q) field %q", tc.vals, f)
		}
	}
}

func TestParseBody(t *testing.T) {
	for _, tc := range []struct {
		body  string
		field string
	}{
		{"", ""},
		{"   ", ""},
		{"{", ""},
		{"[]", ""},
		{`"x"`, ""},
		{"null", ""},
		{`{} {}`, ""},
		{`{}x`, ""},
		{`{"kind":NaN}`, ""},
		{`{"a":1,"a":2}`, ""},
		{`{"args":{"k":1,"k":2}}`, "args"},
		{"{\"kind\":\"\xff\"}", ""},
		{`{"unknown":1}`, "unknown"},
		{`{"kind":"x","step_id":"y"}`, "step_id"},
		{strings.Repeat("[", 129) + strings.Repeat("]", 129), ""},
	} {
		_, err := parseBody([]byte(tc.body), "kind", "args")
		f := validationField(t, err)
		if tc.field != "" && f != tc.field {
			t.Errorf("parseBody(%.30q) field %q, want %q", tc.body, f, tc.field)
		}
	}
	// Whitespace around one object is fine; user JSON may hold any keys.
	f, err := parseBody([]byte(" \n{ \"args\" : {\"anything\": [1, {\"deep\": null}]}, \"kind\": \"local\" }\t"), "kind", "args")
	if err != nil {
		t.Fatal(err)
	}
	if string(f.raw("args")) != `{"anything": [1, {"deep": null}]}` || f.str("kind") != "local" || f.err != nil {
		t.Fatalf("args %s kind %q err %v", f.raw("args"), f.str("kind"), f.err)
	}
	// Nesting of exactly 128 is accepted.
	deep := `{"args":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`
	if _, err := parseBody([]byte(deep), "args"); err != nil {
		t.Fatalf("nesting 128: %v", err)
	}
}

func TestFieldTypes(t *testing.T) {
	body := `{"s":"text","n":42,"neg":-3,"big":9223372036854775808,"frac":1.5,"exp":1e3,"b":true,"arr":["a","b"],
		"mixed":["a",1],"obj":{"k":1},"null":null,"empty":""}`
	known := []string{"s", "n", "neg", "big", "frac", "exp", "b", "arr", "mixed", "obj", "null", "empty", "absent"}
	parse := func() *fields {
		f, err := parseBody([]byte(body), known...)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := parse()
	if f.str("s") != "text" || f.str("null") != "" || f.str("absent") != "" || f.str("empty") != "" || f.err != nil {
		t.Fatalf("str: %v", f.err)
	}
	if n, ok := f.integer("n", 0, 100); !ok || n != 42 || f.err != nil {
		t.Fatalf("integer = %d %v %v", n, ok, f.err)
	}
	if _, ok := f.integer("null", 0, 1); ok || f.err != nil {
		t.Fatal("null integer is not absent")
	}
	if !f.boolean("b") || f.boolean("null") || f.err != nil {
		t.Fatal("boolean")
	}
	if l, ok := f.strings("arr"); !ok || strings.Join(l, ",") != "a,b" {
		t.Fatalf("strings = %v %v", l, ok)
	}
	if l, ok := f.strings("absent"); ok || l != nil {
		t.Fatal("absent strings")
	}
	if string(f.object("obj")) != `{"k":1}` || f.object("null") != nil || f.raw("null") != nil || f.value("null") != nil || f.err != nil {
		t.Fatal("object / raw / value")
	}

	for _, tc := range []struct {
		name string
		use  func(f *fields)
		fld  string
	}{
		{"string given a number", func(f *fields) { f.str("n") }, "n"},
		{"integer given a string", func(f *fields) { f.integer("s", 0, 10) }, "s"},
		{"integer with a fraction", func(f *fields) { f.integer("frac", 0, 10) }, "frac"},
		{"integer with an exponent", func(f *fields) { f.integer("exp", 0, 10000) }, "exp"},
		{"integer over 64 bits", func(f *fields) { f.integer("big", 0, 1<<63-1) }, "big"},
		{"integer below the range", func(f *fields) { f.integer("neg", 0, 10) }, "neg"},
		{"integer above the range", func(f *fields) { f.integer("n", 0, 10) }, "n"},
		{"boolean given a string", func(f *fields) { f.boolean("s") }, "s"},
		{"strings given an object", func(f *fields) { f.strings("obj") }, "obj"},
		{"strings with a number", func(f *fields) { f.strings("mixed") }, "mixed"},
		{"object given an array", func(f *fields) { f.object("arr") }, "arr"},
		{"first error wins", func(f *fields) { f.str("n"); f.boolean("s") }, "n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := parse()
			tc.use(f)
			if got := validationField(t, f.err); got != tc.fld {
				t.Fatalf("field = %q, want %q", got, tc.fld)
			}
		})
	}
}

func TestQueryParameters(t *testing.T) {
	c := func(target string) *call { return &call{r: httptest.NewRequest("GET", target, nil)} }
	if v, err := c("/x?a=1&b=").query("b"); err != nil || v != "" {
		t.Fatalf("empty value = %q, %v", v, err)
	}
	if v, err := c("/x?a=1").query("z"); err != nil || v != "" {
		t.Fatalf("absent = %q, %v", v, err)
	}
	if _, err := c("/x?a=1&a=2").query("a"); validationField(t, err) != "a" {
		t.Fatal("a repeated parameter was accepted")
	}
	if _, err := c("/x?a=&a=").query("a"); err == nil {
		t.Fatal("a repeated empty parameter was accepted")
	}
	if n, ok, err := c("/x?after_seq=12").queryInt("after_seq"); err != nil || !ok || n != 12 {
		t.Fatalf("queryInt = %d %v %v", n, ok, err)
	}
	if _, ok, err := c("/x?after_seq=").queryInt("after_seq"); err != nil || ok {
		t.Fatalf("empty queryInt = %v %v", ok, err)
	}
	for _, bad := range []string{"-5", "1.0", "abc", "99999999999999999999"} {
		if _, _, err := c("/x?after_seq=" + bad).queryInt("after_seq"); validationField(t, err) != "after_seq" {
			t.Fatalf("after_seq=%s accepted", bad)
		}
	}
	for target, want := range map[string]int{"/x": 0, "/x?limit=": 0, "/x?limit=7": 7, "/x?limit=-1": -1, "/x?limit=99999999999999": 1 << 31} {
		if n, err := c(target).limit(); err != nil || n != want {
			t.Errorf("%s: limit = %d, %v; want %d", target, n, err, want)
		}
	}
	if _, err := c("/x?limit=abc").limit(); err == nil {
		t.Fatal("limit=abc accepted")
	}
}

func TestDispatchHeaders(t *testing.T) {
	mk := func(kv ...string) *call {
		r := httptest.NewRequest("POST", "/x", nil)
		for i := 0; i < len(kv); i += 2 {
			r.Header.Add(kv[i], kv[i+1])
		}
		return &call{r: r}
	}
	h, err := mk(wire.HeaderDispatchID, "01920000-0000-7000-8000-00000000000A", wire.HeaderDispatchAttempt, "3").dispatchHeaders()
	if err != nil || h.ID != "01920000-0000-7000-8000-00000000000a" || h.Attempt != 3 {
		t.Fatalf("headers = %+v, %v", h, err)
	}
	if h, err := mk().dispatchHeaders(); err != nil || h != (kernel.DispatchHeaders{}) {
		t.Fatalf("none = %+v, %v", h, err)
	}
	for _, kv := range [][]string{
		{wire.HeaderDispatchID, "abc"},
		{wire.HeaderDispatchID, "01920000-0000-7000-8000-000000000001", wire.HeaderDispatchID, "01920000-0000-7000-8000-000000000001"},
		{wire.HeaderDispatchAttempt, "0"},
		{wire.HeaderDispatchAttempt, "-1"},
		{wire.HeaderDispatchAttempt, "x"},
		{wire.HeaderDispatchAttempt, "2147483648"},
	} {
		if _, err := mk(kv...).dispatchHeaders(); err == nil {
			t.Errorf("headers %q accepted", kv)
		} else {
			validationField(t, err)
		}
	}
}
