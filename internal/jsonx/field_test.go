package jsonx

import "testing"

func TestField(t *testing.T) {
	cases := []struct {
		data, key string
		want      string // "<nil>" when absent
	}{
		{`{"step_id":"abc","target":"t"}`, "step_id", `"abc"`},
		{`{"step_id":"abc","target":"t"}`, "target", `"t"`},
		{` { "a" : 1 , "b" : [1,{"c":"}"}] , "c" : true } `, "c", `true`},
		{`{"a":{"step_id":"nested"},"step_id":"top"}`, "step_id", `"top"`},
		{`{"a":"quote \" and } brace","b":2}`, "b", `2`},
		{`{"a":"x\\","b":-1.5e3}`, "b", `-1.5e3`},
		{`{"generations":{"ws":3},"step_id":"s"}`, "generations", `{"ws":3}`},
		{`{"a":null}`, "a", `null`},
		{`{"a":1}`, "b", "<nil>"},
		{`{}`, "a", "<nil>"},
		{`["a","b"]`, "a", "<nil>"},
		{`"a"`, "a", "<nil>"},
		{``, "a", "<nil>"},
		{`{"a"`, "a", "<nil>"},
		{`{"a":"unterminated`, "a", "<nil>"},
		{`{"a":[1,2`, "a", "<nil>"},
		{`{"\u0061":1}`, "a", "<nil>"}, // escaped keys are compared as written
	}
	for _, c := range cases {
		got := Field([]byte(c.data), c.key)
		s := "<nil>"
		if got != nil {
			s = string(got)
		}
		if s != c.want {
			t.Errorf("Field(%s, %q) = %s, want %s", c.data, c.key, s, c.want)
		}
	}
}

func TestFieldDoesNotAllocate(t *testing.T) {
	data := []byte(`{"rule_id":"permissive","step_id":"6f53a3e89b3f7f465efa3947fd0960ea1093a0fedceea3f6039c408dfd07b513","step_type":"tool_call","target":"t"}`)
	if n := testing.AllocsPerRun(100, func() { Field(data, "target") }); n != 0 {
		t.Fatalf("Field allocated %v times", n)
	}
}
