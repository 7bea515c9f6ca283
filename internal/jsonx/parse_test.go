package jsonx

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

const testDepth = 128

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		in   string
		kind Kind
	}{
		{`0`, KindNumber},
		{`-0`, KindNumber},
		{`1e999999`, KindNumber},
		{`-1.5E-10`, KindNumber},
		{`1E+2`, KindNumber},
		{`12345678901234567890`, KindNumber},
		{`0.0e0`, KindNumber},
		{`true`, KindBool},
		{`false`, KindBool},
		{`null`, KindNull},
		{`""`, KindString},
		{`"\u0000"`, KindString},
		{"\"\x7f\"", KindString}, // DEL is not a control character for JSON
		{"\"\u2028\u2029\"", KindString},
		{"\"é😀\"", KindString},
		{`"\ud800"`, KindString},
		{`"\udc00\ud800"`, KindString},
		{" \t\n\r{} \t\n\r", KindObject},
		{`[]`, KindArray},
		{`[[],{}]`, KindArray},
		{`{"":1}`, KindObject},
		{`{"a":{"a":1}}`, KindObject},                 // same key at different levels
		{`[{"a":1},{"a":2}]`, KindArray},              // same key in sibling objects
		{`{"a":1,"A":2,"a ":3}`, KindObject},          // keys differ only in case or space
		{`{"\u00e9":1,"\u00c3\u00a9":2}`, KindObject}, // different decoded keys
	}
	for _, tt := range tests {
		v, err := Parse([]byte(tt.in), testDepth)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if v.Kind != tt.kind {
			t.Errorf("Parse(%q).Kind = %v, want %v", tt.in, v.Kind, tt.kind)
		}
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
		msg  string // substring of Error.Msg
		off  int
	}{
		{"empty", ``, "empty input", 0},
		{"only whitespace", " \n", "unexpected end of input", 2},
		{"trailing value", `1 2`, "unexpected data after the value", 2},
		{"trailing after object", `{} x`, "unexpected data after the value", 3},
		{"trailing nul byte", "{}\x00", "unexpected data after the value", 2},
		{"vertical tab is not whitespace", "\v1", "unexpected character", 0},
		{"form feed is not whitespace", "1\f", "unexpected data after the value", 1},
		{"nbsp is not whitespace", "1\u00a0", "unexpected data after the value", 1},
		{"byte order mark", "\xef\xbb\xbf{}", "unexpected character U+FEFF", 0},
		{"comment", "/*x*/1", "unexpected character '/'", 0},

		{"invalid UTF-8 alone", "\xff", "invalid UTF-8", 0},
		{"invalid UTF-8 in string", "\"a\xffb\"", "invalid UTF-8", 2},
		{"invalid UTF-8 after escape", "\"\\n\xff\"", "invalid UTF-8", 3},
		{"encoded surrogate", "\"\xed\xa0\x80\"", "invalid UTF-8", 1},
		{"overlong encoding", "\"\xc0\xaf\"", "invalid UTF-8", 1},
		{"truncated sequence", "\"\xe2\x80\"", "invalid UTF-8", 1},
		{"invalid UTF-8 in key", "{\"a\xff\":1}", "invalid UTF-8", 3},
		{"invalid UTF-8 between tokens", "[1,\xff]", "invalid UTF-8", 3},

		{"NaN", `NaN`, "unexpected character 'N'", 0},
		{"Infinity", `Infinity`, "unexpected character 'I'", 0},
		{"negative Infinity", `-Infinity`, "invalid number", 0},
		{"NaN in array", `[1,NaN]`, "unexpected character 'N'", 3},
		{"capitalised literal", `True`, "unexpected character 'T'", 0},
		{"truncated literal", `nul`, "invalid literal", 0},
		{"misspelt literal", `fals3`, "invalid literal", 0},
		{"literal with suffix", `truex`, "unexpected data after the value", 4},
		{"undefined", `undefined`, "unexpected character 'u'", 0},

		{"leading zero", `01`, "leading zero", 0},
		{"negative leading zero", `-01`, "leading zero", 0},
		{"double zero", `00`, "leading zero", 0},
		{"no fraction digit", `1.`, "no digit after '.'", 0},
		{"no integer part", `.5`, "unexpected character '.'", 0},
		{"plus sign", `+1`, "unexpected character '+'", 0},
		{"lone minus", `-`, "invalid number", 0},
		{"double minus", `--1`, "invalid number", 0},
		{"empty exponent", `1e`, "no digit in exponent", 0},
		{"signed empty exponent", `1e+`, "no digit in exponent", 0},
		{"fraction then exponent", `1.e5`, "no digit after '.'", 0},
		{"hex", `0x10`, "unexpected data after the value", 1},
		{"two dots", `1.5.5`, "unexpected data after the value", 3},

		{"raw control character", "\"a\x01\"", "control character U+0001", 2},
		{"raw tab", "\"\t\"", "control character U+0009", 1},
		{"raw newline after escape", "\"\\t\n\"", "control character U+000A", 3},
		{"raw nul", "\"\x00\"", "control character U+0000", 1},
		{"raw unit separator", "\"ab\x1f\"", "control character U+001F", 3},
		{"raw unit separator after escape", "\"\\n\x1f\"", "control character U+001F", 3},
		{"unknown escape", `"\x"`, "invalid escape", 1},
		{"single-quote escape", `"\'"`, "invalid escape", 1},
		{"capital U escape", `"\U0041"`, "invalid escape", 1},
		{"short unicode escape", `"\u12"`, "invalid \\u escape", 1},
		{"bad hex digit", `"\u12g4"`, "invalid \\u escape", 1},
		{"bad low surrogate escape", `"\ud800\uzzzz"`, "invalid \\u escape", 7},
		{"backslash at end", `"\`, "unterminated string", 2},
		{"unterminated", `"abc`, "unterminated string", 4},

		{"trailing comma in array", `[1,]`, "unexpected character ']'", 3},
		{"trailing comma in object", `{"a":1,}`, "expected a string key", 7},
		{"leading comma", `[,1]`, "unexpected character ','", 1},
		{"empty member", `{,}`, "expected a string key", 1},
		{"key without value", `{"a"}`, "expected ':'", 4},
		{"missing colon", `{"a" 1}`, "expected ':'", 5},
		{"number key", `{1:2}`, "expected a string key", 1},
		{"single-quoted key", `{'a':1}`, "expected a string key", 1},
		{"missing comma", `[1 2]`, "expected ',' or ']'", 3},
		{"mismatched close", `{"a":1]`, "expected ',' or '}'", 6},
		{"mismatched close array", `[1}`, "expected ',' or ']'", 2},
		{"unclosed array", `[`, "unexpected end of input", 1},
		{"unclosed object", `{`, "unexpected end of input", 1},
		{"unclosed after member", `{"a":1`, "unexpected end of input", 6},
		{"stray close", `]`, "unexpected character ']'", 0},

		{"duplicate key", `{"a":1,"a":2}`, `duplicate key "a"`, 7},
		{"duplicate key via escape", `{"a":1,"\u0061":2}`, `duplicate key "a"`, 7},
		{"duplicate empty key", `{"":1,"":2}`, `duplicate key ""`, 6},
		{"duplicate non-adjacent", `{"a":1,"b":2,"a":3}`, `duplicate key "a"`, 13},
		{"duplicate in nested array", `[{"x":[{"k":1,"k":1}]}]`, `duplicate key "k"`, 14},
		{"duplicate after nested object", `{"a":{"b":1},"a":2}`, `duplicate key "a"`, 13},
		{"duplicate surrogate keys", `{"\ud800":1,"\udbff":2}`, `duplicate key "` + "\uFFFD" + `"`, 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Parse([]byte(tt.in), testDepth)
			if err == nil {
				t.Fatalf("Parse(%q) = %s, want error", tt.in, v.Raw)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse(%q) error %T, want *Error", tt.in, err)
			}
			if !strings.Contains(e.Msg, tt.msg) || e.Offset != tt.off {
				t.Errorf("Parse(%q) = %q at offset %d, want %q at offset %d", tt.in, e.Msg, e.Offset, tt.msg, tt.off)
			}
		})
	}
}

// TestParseDuplicateKeyLargeObject covers objects big enough to switch from
// scanning to a key index, with the first occurrence on either side of the
// switch.
func TestParseDuplicateKeyLargeObject(t *testing.T) {
	for _, n := range []int{dupScanLimit - 1, dupScanLimit, dupScanLimit + 1, 100} {
		for _, dupOf := range []int{0, n / 2, n - 1} {
			var b strings.Builder
			b.WriteString("{")
			for i := range n {
				b.WriteString(`"k` + strconv.Itoa(i) + `":0,`)
			}
			off := b.Len()
			b.WriteString(`"k` + strconv.Itoa(dupOf) + `":1}`)
			_, err := Parse([]byte(b.String()), testDepth)
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(e.Msg, "duplicate key") || e.Offset != off {
				t.Errorf("n=%d dup of k%d: err = %v, want duplicate key at offset %d", n, dupOf, err, off)
			}
			// The same object without the duplicate is fine.
			ok := b.String()[:off-1] + "}"
			if _, err := Parse([]byte(ok), testDepth); err != nil {
				t.Errorf("n=%d: %v", n, err)
			}
		}
	}
}

func nested(depth int, open, close, inner string) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

func TestParseDepth(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		maxDepth int
		ok       bool
	}{
		{"arrays at limit", nested(128, "[", "]", ""), 128, true},
		{"arrays over limit", nested(129, "[", "]", ""), 128, false},
		{"objects at limit", nested(128, `{"a":`, "}", "1"), 128, true},
		{"objects over limit", nested(129, `{"a":`, "}", "1"), 128, false},
		{"mixed at limit", nested(64, `[{"a":`, "}]", "[]"), 129, true},
		{"mixed over limit", nested(64, `[{"a":`, "}]", "[]"), 128, false},
		{"empty innermost counts", nested(127, "[", "]", "{}"), 128, true},
		{"empty innermost over", nested(128, "[", "]", "{}"), 128, false},
		{"siblings do not add up", "[" + strings.Repeat(nested(127, "[", "]", "")+",", 10) + "1]", 128, true},
		{"scalar at depth zero", `1`, 0, true},
		{"container at depth zero", `[]`, 0, false},
		{"small limit", nested(3, "[", "]", ""), 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in), tt.maxDepth)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "nesting deeper than "+strconv.Itoa(tt.maxDepth)) {
				t.Errorf("err = %v, want a nesting error", err)
			}
		})
	}
}

// TestParseVeryDeep makes sure depth is bounded without recursion: a limit
// far beyond anything a goroutine stack could recurse through still works.
func TestParseVeryDeep(t *testing.T) {
	const depth = 1 << 18
	in := nested(depth, "[", "]", "")
	if _, err := Parse([]byte(in), depth); err != nil {
		t.Fatal(err)
	}
	_, err := Parse([]byte(in), depth-1)
	var e *Error
	if !errors.As(err, &e) || e.Offset != depth-1 {
		t.Fatalf("err = %v, want nesting error at offset %d", err, depth-1)
	}
}

func TestParseStrings(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{`""`, ""},
		{`"abc"`, "abc"},
		{`"\"\\\/\b\f\n\r\t"`, "\"\\/\b\f\n\r\t"},
		{`"\u0041\u00e9\u00E9"`, "Aéé"},
		{`"\u0000"`, "\x00"},
		{`"\ud800"`, "\uFFFD"},
		{`"\udfff"`, "\uFFFD"},
		{`"x\ud800y"`, "x\uFFFDy"},
		{`"\ud800\u0041"`, "\uFFFDA"},
		{`"\ud800\ud800\udc00"`, "\uFFFD\U00010000"},
		{`"\udc00\ud800"`, "\uFFFD\uFFFD"},
		{`"\udc00\udc00"`, "\uFFFD\uFFFD"},
		{`"\ud800\n"`, "\uFFFD\n"},
		{`"\ud83d\ude00"`, "\U0001F600"},
		{`"\uD83D\uDE00"`, "\U0001F600"},
		{`"\udbff\udfff"`, "\U0010FFFF"},
		{`"\uff41"`, "\uFF41"},
		{"\"é\\u00e9é\"", "ééé"},
		{"\"\U0001F600\"", "\U0001F600"},
		{`"a\u2028b"`, "a\u2028b"},
	}
	for _, tt := range tests {
		v, err := Parse([]byte(tt.in), testDepth)
		if err != nil {
			t.Errorf("Parse(%s): %v", tt.in, err)
			continue
		}
		if v.Kind != KindString || v.Str != tt.want {
			t.Errorf("Parse(%s) = %v %+q, want string %+q", tt.in, v.Kind, v.Str, tt.want)
		}
		if string(v.Raw) != tt.in {
			t.Errorf("Parse(%s).Raw = %s", tt.in, v.Raw)
		}
	}
}

func TestParseKeysDecoded(t *testing.T) {
	v, err := Parse([]byte(`{"\u0061":1,"b\n":2,"\ud83d\ude00":3}`), testDepth)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range v.Members {
		keys = append(keys, m.Key)
	}
	if got, want := strings.Join(keys, "|"), "a|b\n|\U0001F600"; got != want {
		t.Errorf("keys = %q, want %q", got, want)
	}
}

func TestParseStructure(t *testing.T) {
	v, err := Parse([]byte(`{"b":[1,true,null,"s"],"a":{"x":false}}`), testDepth)
	if err != nil {
		t.Fatal(err)
	}
	if v.Kind != KindObject || len(v.Members) != 2 || v.Members[0].Key != "b" || v.Members[1].Key != "a" {
		t.Fatalf("members not in input order: %+v", v.Members)
	}
	b := v.Get("b")
	if b == nil || b.Kind != KindArray || len(b.Elems) != 4 {
		t.Fatalf("b = %+v", b)
	}
	kinds := []Kind{KindNumber, KindBool, KindNull, KindString}
	for i, e := range b.Elems {
		if e.Kind != kinds[i] {
			t.Errorf("b[%d].Kind = %v, want %v", i, e.Kind, kinds[i])
		}
	}
	if !b.Elems[1].Bool || b.Elems[3].Str != "s" {
		t.Errorf("b = %s, Bool=%v Str=%q", b.Raw, b.Elems[1].Bool, b.Elems[3].Str)
	}
	if x := v.Get("a").Get("x"); x == nil || x.Kind != KindBool || x.Bool {
		t.Errorf("a.x = %+v", x)
	}
	if v.Get("c") != nil || b.Get("b") != nil || (*Value)(nil).Get("a") != nil {
		t.Error("Get returned a value for a missing member, an array, or a nil value")
	}
}

// TestParseRaw checks that Raw is the exact input text of every value and
// aliases the input (verbatim storage depends on both).
func TestParseRaw(t *testing.T) {
	in := []byte(" \n{ \"a\" : [ 1.50 , \"x\\n\" , true ,{ } ] ,\t\"b\":-0e+1 , \"c\" : null}\r\n")
	v, err := Parse(in, testDepth)
	if err != nil {
		t.Fatal(err)
	}
	a := v.Get("a")
	tests := []struct {
		v    *Value
		want string
	}{
		{v, "{ \"a\" : [ 1.50 , \"x\\n\" , true ,{ } ] ,\t\"b\":-0e+1 , \"c\" : null}"},
		{a, `[ 1.50 , "x\n" , true ,{ } ]`},
		{a.Elems[0], `1.50`},
		{a.Elems[1], `"x\n"`},
		{a.Elems[2], `true`},
		{a.Elems[3], `{ }`},
		{v.Get("b"), `-0e+1`},
		{v.Get("c"), `null`},
	}
	for _, tt := range tests {
		if string(tt.v.Raw) != tt.want {
			t.Errorf("Raw = %q, want %q", tt.v.Raw, tt.want)
			continue
		}
		off := strings.Index(string(in), tt.want)
		if &tt.v.Raw[0] != &in[off] {
			t.Errorf("Raw %q is a copy, not a sub-slice of the input", tt.want)
		}
		if cap(tt.v.Raw) != len(tt.v.Raw) {
			t.Errorf("Raw %q has spare capacity %d: appending would overwrite the input", tt.want, cap(tt.v.Raw)-len(tt.v.Raw))
		}
	}
}

func TestErrorLocation(t *testing.T) {
	tests := []struct {
		in   string
		path string
		off  int
		text string
	}{
		{`{"args":{"items":[1,2,3,tru]}}`, "args.items[3]", 24, "invalid literal at args.items[3]"},
		{`{"args":{"x":{"a":1,"a":2}}}`, "args.x", 20, `duplicate key "a" at args.x`},
		{`[1 2]`, "", 3, "expected ',' or ']' at offset 3"},
		{"{\"a\":1,\"b\xff\":2}", "", 9, "invalid UTF-8 at offset 9"},
		{"[0,{\"name\":\"ok\",\"v\":\"b\xffd\"}]", "[1].v", 22, "invalid UTF-8 at [1].v"},
		{`{"a b":[1,}`, `["a b"][1]`, 10, `unexpected character '}' at ["a b"][1]`},
		{`{"a":{"b":1 "c"}}`, "a", 12, "expected ',' or '}' at a"},
		{`{"a":[[1],[2],[3,{"k":"v" :}]]}`, "a[2][1]", 26, "expected ',' or '}' at a[2][1]"},
		{`{"a":{"b":[[]]}}`, "a.b[0]", 11, "nesting deeper than 3 at a.b[0]"},
		{`[{"x":1,"y":01}]`, "[0].y", 12, "invalid number: leading zero at [0].y"},
		{`{"a":1} {`, "", 8, "unexpected data after the value at offset 8"},
		{`{"` + strings.Repeat("k", 70) + `":nul}`, `["` + strings.Repeat("k", 64) + `…"]`, 74, ""},
	}
	for _, tt := range tests {
		maxDepth := testDepth
		if strings.Contains(tt.text, "nesting") {
			maxDepth = 3
		}
		_, err := Parse([]byte(tt.in), maxDepth)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("Parse(%q) = %v, want *Error", tt.in, err)
			continue
		}
		if e.Path != tt.path || e.Offset != tt.off {
			t.Errorf("Parse(%q): path %q offset %d, want %q %d (%v)", tt.in, e.Path, e.Offset, tt.path, tt.off, err)
		}
		if tt.text != "" && e.Error() != tt.text {
			t.Errorf("Parse(%q).Error() = %q, want %q", tt.in, e.Error(), tt.text)
		}
	}
}

func TestKindString(t *testing.T) {
	want := map[Kind]string{
		KindNull: "null", KindBool: "boolean", KindNumber: "number",
		KindString: "string", KindArray: "array", KindObject: "object", Kind(9): "Kind(9)",
	}
	for k, s := range want {
		if k.String() != s {
			t.Errorf("Kind(%d).String() = %q, want %q", k, k.String(), s)
		}
	}
}

// TestPlain8 checks the word-at-a-time scan against the byte table for every
// byte value in every position, and for words with two special bytes, where
// a borrow from one could hide the other.
func TestPlain8(t *testing.T) {
	word := func(b []byte) uint64 {
		var x uint64
		for i := 7; i >= 0; i-- {
			x = x<<8 | uint64(b[i])
		}
		return x
	}
	for pos := range 8 {
		for c := range 256 {
			b := []byte("abcdefgh")
			b[pos] = byte(c)
			if got := plain8(word(b)); got != strPlain[c] {
				t.Fatalf("plain8(%q) = %v, want %v", b, got, strPlain[c])
			}
		}
	}
	specials := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"', '\\', 0x7f, 0x80, 0xff}
	for p1 := range 8 {
		for p2 := p1 + 1; p2 < 8; p2++ {
			for _, c1 := range specials {
				for _, c2 := range specials {
					b := []byte("        ")
					b[p1], b[p2] = c1, c2
					if got, want := plain8(word(b)), strPlain[c1] && strPlain[c2]; got != want {
						t.Fatalf("plain8(%q) = %v, want %v", b, got, want)
					}
				}
			}
		}
	}
}

// TestParseLongStrings exercises the word-at-a-time scan near string ends.
func TestParseLongStrings(t *testing.T) {
	for n := range 40 {
		for _, special := range []string{``, `\n`, "\x01", "é", "\xff", `"`} {
			body := strings.Repeat("x", n) + special + strings.Repeat("y", 9)
			in := `"` + body + `"`
			v, err := Parse([]byte(in), testDepth)
			switch special {
			case "\x01", "\xff":
				var e *Error
				if !errors.As(err, &e) || e.Offset != 1+n {
					t.Fatalf("Parse(%q) = %v, want error at %d", in, err, 1+n)
				}
			case `"`:
				if err == nil {
					t.Fatalf("Parse(%q) accepted a string with a stray quote", in)
				}
			default:
				want := strings.ReplaceAll(body, `\n`, "\n")
				if err != nil || v.Str != want {
					t.Fatalf("Parse(%q) = %v, %v", in, v, err)
				}
			}
		}
	}
}

// TestReleaseClearsScratch guards against the pool keeping a failed parse's
// values alive through pointers left on the scratch stacks.
func TestReleaseClearsScratch(t *testing.T) {
	sc := &scratch{
		stack:   []frame{{v: &Value{}, key: "k"}},
		elems:   []*Value{{}},
		members: []Member{{Key: "k", Value: &Value{}}},
	}
	p := parser{scratch: sc}
	p.release()
	if f := sc.stack[:1][0]; f.v != nil || f.key != "" || sc.elems[:1][0] != nil || sc.members[:1][0] != (Member{}) {
		t.Error("release left pointers in the scratch space")
	}
	if len(sc.stack)+len(sc.elems)+len(sc.members) != 0 {
		t.Error("release did not reset the scratch stacks")
	}
}

// TestParseConcurrent runs parses, failing ones included, on many goroutines
// so that the race detector can check the pooled scratch space.
func TestParseConcurrent(t *testing.T) {
	inputs := []string{typicalBody, `{"a":[1,2,{"b":"\u00e9"}]}`, `{"a":1,"a":2}`, `[[[`, `"x\ud800"`}
	want := make([]string, len(inputs))
	for i, in := range inputs {
		if c, err := CanonicalBytes([]byte(in), testDepth); err == nil {
			want[i] = string(c)
		}
	}
	done := make(chan string, 8)
	for g := range 8 {
		go func() {
			for k := range 300 {
				i := (g + k) % len(inputs)
				c, err := CanonicalBytes([]byte(inputs[i]), testDepth)
				if got := string(c); (err == nil) != (want[i] != "") || got != want[i] {
					done <- "input " + strconv.Itoa(i) + " gave " + got
					return
				}
			}
			done <- ""
		}()
	}
	for range 8 {
		if msg := <-done; msg != "" {
			t.Error(msg)
		}
	}
}
