package yamlx

import "testing"

func TestErrorFormat(t *testing.T) {
	for _, tt := range []struct {
		e    Error
		want string
	}{
		{Error{Line: 7, Path: "rules[1].when.targt", Problem: "unknown key"}, "line 7: rules[1].when.targt: unknown key"},
		{Error{Line: 3, Problem: "more than one YAML document"}, "line 3: more than one YAML document"},
		{Error{Problem: "bundle is too large"}, "bundle is too large"},
		{Error{Path: "rules", Problem: "x"}, "rules: x"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestDocument(t *testing.T) {
	for _, tt := range []struct {
		text      string
		wantRoot  bool
		wantError string
	}{
		{"", false, ""},
		{"# only a comment\n", false, ""},
		{" \n\t\n", false, ""},
		{"---\n", false, ""},
		{"~\n", true, ""}, // an explicit null is content, only a bare one is empty
		{"a: 1\n", true, ""},
		{"a: 1\n---\nb: 2\n", false, "line 2: more than one YAML document"},
		{"a: [1\n", false, "line 2: invalid YAML: did not find expected ',' or ']'"},
		{"a: \x01\n", false, "line 1: invalid YAML: control character U+0001 is not allowed"},
		{"a: *nowhere\n", false, "line 1: invalid YAML: unknown anchor 'nowhere' referenced"},
	} {
		doc, err := Document(tt.text)
		root := Root(doc)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.wantError || (root != nil) != tt.wantRoot {
			t.Errorf("Document(%q) = root %v, error %q; want root %v, error %q", tt.text, root != nil, got, tt.wantRoot, tt.wantError)
		}
	}
}

func TestCheck(t *testing.T) {
	doc, err := Document("a: 1\nb:\n  - !!binary aGk=\n  - {x: 1, x: 2}\n<<: {c: 3}\n")
	if err != nil {
		t.Fatal(err)
	}
	root := Root(doc)
	var got []string
	for _, e := range Check(root) {
		got = append(got, e.Error())
	}
	want := []string{
		"line 3: b[0]: non-standard tag !!binary",
		"line 4: b[1].x: duplicate key (first at line 4)",
		`line 5: ["<<"]: merge keys are not supported`,
	}
	if len(got) != len(want) {
		t.Fatalf("Check = %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Check[%d] = %q, want %q", i, got[i], want[i])
		}
	}
}
