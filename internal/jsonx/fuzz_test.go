package jsonx

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParse checks Parse against encoding/json, which serves as an
// independent implementation: whatever Parse accepts must be valid JSON, and
// because encoding/json sorts map keys bytewise, escapes exactly as docs/protocol/identity.md §2
// does and (with UseNumber) keeps number literals, re-marshalling its decoding
// must give the same bytes as Canonical.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data, testDepth)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("Parse accepted %q, which encoding/json rejects", data)
		}
		if !bytes.Equal(v.Raw, bytes.Trim(data, " \t\n\r")) {
			t.Fatalf("top-level Raw %q is not the trimmed input", v.Raw)
		}

		c := Canonical(v)
		v2, err := Parse(c, testDepth)
		if err != nil {
			t.Fatalf("canonical form %q does not parse: %v", c, err)
		}
		if c2 := Canonical(v2); !bytes.Equal(c, c2) {
			t.Fatalf("canonical form is not a fixed point:\n%q\n%q", c, c2)
		}

		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var any any
		if err := dec.Decode(&any); err != nil {
			t.Fatalf("encoding/json cannot decode %q: %v", data, err)
		}
		want, err := json.Marshal(any)
		if err != nil {
			t.Fatalf("encoding/json cannot re-encode %q: %v", data, err)
		}
		if !bytes.Equal(c, want) {
			t.Fatalf("canonical form differs from encoding/json:\n got %q\nwant %q", c, want)
		}

		checkSubvalues(t, v, 0)
		checkMembers(t, v, data)
	})
}

// checkMembers holds Field to Get on every top-level member whose key is
// written without escapes (Field compares keys as written).
func checkMembers(t *testing.T, v *Value, data []byte) {
	if v.Kind != KindObject {
		if Field(data, "") != nil {
			t.Fatalf("Field found a member in the %s %q", v.Kind, data)
		}
		return
	}
	for _, m := range v.Members {
		if bytes.Contains([]byte(m.Key), []byte{'\\'}) || !bytes.Contains(data, append(append([]byte{'"'}, m.Key...), '"')) {
			continue
		}
		if got := Field(data, m.Key); !bytes.Equal(got, m.Value.Raw) {
			t.Fatalf("Field(%q, %q) = %q, want %q", data, m.Key, got, m.Value.Raw)
		}
	}
}

// checkSubvalues re-parses the Raw of every nested value: each must be the
// complete text of that value and canonicalise like the value itself.
func checkSubvalues(t *testing.T, v *Value, budget int) int {
	if budget > 200 {
		return budget
	}
	sub, err := Parse(v.Raw, testDepth)
	if err != nil {
		t.Fatalf("Raw %q of a nested value does not parse: %v", v.Raw, err)
	}
	if !bytes.Equal(Canonical(sub), Canonical(v)) {
		t.Fatalf("Raw %q does not match its value", v.Raw)
	}
	budget++
	for _, e := range v.Elems {
		budget = checkSubvalues(t, e, budget)
	}
	for _, m := range v.Members {
		budget = checkSubvalues(t, m.Value, budget)
	}
	return budget
}
