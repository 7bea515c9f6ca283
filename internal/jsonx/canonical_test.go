package jsonx

import (
	"strconv"
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"whitespace removed", " [ 1 , { } , [ ] ] ", `[1,{},[]]`},
		{"numbers kept as written", `[1,1.0,1E2,-0,1e-7,12345678901234567890,1e999999,0.10]`, `[1,1.0,1E2,-0,1e-7,12345678901234567890,1e999999,0.10]`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"keys sorted", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"keys sorted by UTF-8 bytes", `{"é":1,"z":2,"A":3,"a":4,"":5}`, `{"":5,"A":3,"a":4,"z":2,"é":1}`},
		// UTF-16 order would put U+1F600 (a surrogate pair, 0xD83D) before U+FF41.
		{"astral after BMP", `{"\ud83d\ude00":2,"\uff41":1}`, "{\"\uff41\":1,\"\U0001F600\":2}"},
		{"prefix key first", `{"ab":1,"a":2}`, `{"a":2,"ab":1}`},
		{"nested sorted", `{"b":{"y":1,"x":[{"d":0,"c":0}]},"a":0}`, `{"a":0,"b":{"x":[{"c":0,"d":0}],"y":1}}`},
		{"sorted by decoded key", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"many keys", `{"p":0,"o":0,"n":0,"m":0,"l":0,"k":0,"j":0,"i":0,"h":0,"g":0,"f":0,"e":0,"d":0,"c":0,"b":0,"a":0,"q":0}`,
			`{"a":0,"b":0,"c":0,"d":0,"e":0,"f":0,"g":0,"h":0,"i":0,"j":0,"k":0,"l":0,"m":0,"n":0,"o":0,"p":0,"q":0}`},
		{"escapes normalised", `"\u0041\/\u00e9\u000A"`, `"A/é\n"`},
		{"html characters", `"<a href='x'>&amp;</a>"`, `"\u003ca href='x'\u003e\u0026amp;\u003c/a\u003e"`},
		{"line separators", "\"\u2028\\u2029\"", `"\u2028\u2029"`},
		{"controls", `"\u0000\u0007\b\t\n\u000b\f\r\u001f\u007f"`, "\"\\u0000\\u0007\\b\\t\\n\\u000b\\f\\r\\u001f\x7f\""},
		{"lone surrogate", `"\ud800"`, "\"\uFFFD\""},
		{"quote and backslash", `"\"\\"`, `"\"\\"`},
		{"keys escaped too", `{"<\n>":1}`, `{"\u003c\n\u003e":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalBytes([]byte(tt.in), testDepth)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("canonical(%s)\n got %s\nwant %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestCanonicalDoesNotReorderMembers(t *testing.T) {
	v, err := Parse([]byte(`{"b":1,"a":2}`), testDepth)
	if err != nil {
		t.Fatal(err)
	}
	Canonical(v)
	if v.Members[0].Key != "b" {
		t.Error("Canonical reordered Value.Members")
	}
}

func TestCanonicalBytesError(t *testing.T) {
	if _, err := CanonicalBytes([]byte(`{"a":1,"a":2}`), testDepth); err == nil {
		t.Error("CanonicalBytes accepted a duplicate key")
	}
	if _, err := CanonicalBytes([]byte(`[[1]]`), 1); err == nil {
		t.Error("CanonicalBytes ignored maxDepth")
	}
}

// TestCanonicalHandBuilt covers Values not made by Parse: docs/protocol/identity.md §2 has the last
// occurrence of a repeated key win, and nil means absent (null).
func TestCanonicalHandBuilt(t *testing.T) {
	num := func(s string) *Value { return &Value{Kind: KindNumber, Raw: []byte(s)} }
	tests := []struct {
		name string
		v    *Value
		want string
	}{
		{"nil", nil, `null`},
		{"zero value", &Value{}, `null`},
		{"bool from field", &Value{Kind: KindBool, Bool: true, Raw: []byte("false")}, `true`},
		{"repeated key small", &Value{Kind: KindObject, Members: []Member{{"b", num("1")}, {"a", num("2")}, {"b", num("3")}}}, `{"a":2,"b":3}`},
		{"repeated key large", &Value{Kind: KindObject, Members: func() []Member {
			var m []Member
			for _, k := range strings.Split("q w e r t y u i o p a s d f g h j k", " ") {
				m = append(m, Member{k, num("0")})
			}
			return append(m, Member{"a", num("1")})
		}()}, `{"a":1,"d":0,"e":0,"f":0,"g":0,"h":0,"i":0,"j":0,"k":0,"o":0,"p":0,"q":0,"r":0,"s":0,"t":0,"u":0,"w":0,"y":0}`},
		{"repeated keys interleaved", &Value{Kind: KindObject, Members: func() []Member {
			var m []Member
			for i := range 60 {
				m = append(m, Member{string(rune('a' + i%5)), num(strconv.Itoa(i))})
			}
			return m
		}()}, `{"a":55,"b":56,"c":57,"d":58,"e":59}`},
		{"repeated key adjacent sorted", &Value{Kind: KindObject, Members: []Member{{"a", num("1")}, {"a", num("2")}}}, `{"a":2}`},
		{"nil member value", &Value{Kind: KindObject, Members: []Member{{"a", nil}}}, `{"a":null}`},
		{"nil element", &Value{Kind: KindArray, Elems: []*Value{nil, num("1")}}, `[null,1]`},
	}
	for _, tt := range tests {
		if got := string(Canonical(tt.v)); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestAppendString(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", `""`},
		{"plain text", `"plain text"`},
		{"\"\\", `"\"\\"`},
		{"\b\f\n\r\t", `"\b\f\n\r\t"`},
		{"\x00\x01\x0b\x1f", `"\u0000\u0001\u000b\u001f"`},
		{"<>&", `"\u003c\u003e\u0026"`},
		{"\u2028\u2029", `"\u2028\u2029"`},
		{"\u2027\u202a", "\"\u2027\u202a\""},
		{"\x7f", "\"\x7f\""},
		{"/", `"/"`},
		{"é😀\U0010FFFF", "\"é😀\U0010FFFF\""},
		{"a\xffb", "\"a\uFFFDb\""},
		{"\xed\xa0\x80", "\"\uFFFD\uFFFD\uFFFD\""},
		{"x\xe2\x80", "\"x\uFFFD\uFFFD\""},
	}
	for _, tt := range tests {
		got := string(AppendString([]byte("pre:"), tt.in))
		if got != "pre:"+tt.want {
			t.Errorf("AppendString(%+q) = %s, want %s", tt.in, got, "pre:"+tt.want)
		}
	}
}

func TestStringify(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{`5`, `5`},
		{`5.0`, `5.0`},
		{`1e21`, `1e21`},
		{`-0`, `-0`},
		{`12345678901234567890`, `12345678901234567890`},
		{`["a","b"]`, `["a","b"]`},
		{` [ "a" , "b" ] `, `["a","b"]`},
		{`{"k":1}`, `{"k":1}`},
		{`{ "k" : 1, "a": [ ] }`, `{"a":[],"k":1}`},
		{`"hello"`, `hello`},
		{`"a\"b\u00e9<"`, `a"bé<`},
		{`""`, ``},
		{`true`, `true`},
		{`false`, `false`},
		{`null`, `null`},
		{`{"s":"<"}`, `{"s":"\u003c"}`},
	}
	for _, tt := range tests {
		v, err := Parse([]byte(tt.in), testDepth)
		if err != nil {
			t.Fatalf("Parse(%s): %v", tt.in, err)
		}
		if got := Stringify(v); got != tt.want {
			t.Errorf("Stringify(%s) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := Stringify(nil); got != "null" {
		t.Errorf("Stringify(nil) = %q", got)
	}
}
