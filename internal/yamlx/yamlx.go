// Package yamlx reads YAML strictly, for the two YAML inputs an operator
// writes: policy bundles and the provisioning manifest. Both want the same
// guarantees — one document, readable text, no duplicate or merge keys, no
// tags that change what a value means — and messages that name the line and
// key path of each problem, which yaml.v3's typed decoding does not give.
// It does no I/O.
package yamlx

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a YAML text. Line is 1-based, 0 when the problem
// concerns the whole text; Path is the key path (`rules[1].when.target`),
// empty for the document itself.
type Error struct {
	Line    int
	Path    string
	Problem string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// Document reads text that must hold at most one YAML document and returns
// the document node; nil when the text holds no document at all (nothing but
// whitespace or comments). Root gives its content.
func Document(text string) (*yaml.Node, *Error) {
	if strings.Trim(text, " \t\r\n") == "" {
		return nil, nil
	}
	// yaml.v3 reports these without a line; finding them first gives the
	// operator one.
	if line, problem := unreadable(text); problem != "" {
		return nil, &Error{Line: line, Problem: problem}
	}
	dec := yaml.NewDecoder(strings.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntaxError(err, text)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, syntaxError(err, text)
	default:
		return nil, &Error{Line: next.Line, Problem: "more than one YAML document"}
	}
	return &doc, nil
}

// Root is a document's content, or nil when the document is empty: no
// document, a bare `---`, or an untagged empty null. The caller decides
// what an empty document means.
func Root(doc *yaml.Node) *yaml.Node {
	if doc == nil || len(doc.Content) != 1 {
		return nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" && root.Value == "" && root.Style&yaml.TaggedStyle == 0 {
		return nil
	}
	return root
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parserProblems are the errors of yaml.v3's parser, as opposed to its
// scanner. yaml.v3 prints their 0-based line as is, while it adds one for
// scanner errors, and it prints no line at all when the number is 0.
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"found undefined tag handle":             true,
	"did not find expected node content":     true,
	"did not find expected '-' indicator":    true,
	"did not find expected key":              true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
}

// syntaxError turns a yaml.v3 syntax error into an Error with a 1-based
// line, correcting for yaml.v3's reporting (see parserProblems). An unknown
// alias comes without any position, so its line is searched.
func syntaxError(err error, text string) *Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if parserProblems[m[2]] {
			line++
		}
		return &Error{Line: line, Problem: "invalid YAML: " + m[2]}
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 1
	if name, ok := strings.CutPrefix(msg, "unknown anchor '"); ok {
		name, _, _ = strings.Cut(name, "'")
		line = 0
		if i := strings.Index(text, "*"+name); i >= 0 {
			line = 1 + strings.Count(text[:i], "\n")
		}
	}
	return &Error{Line: line, Problem: "invalid YAML: " + msg}
}

// unreadable finds the first byte YAML refuses to read: invalid UTF-8 or a
// character outside YAML's printable set.
func unreadable(text string) (line int, problem string) {
	line = 1
	for i, r := range text {
		switch {
		case r == '\n':
			line++
			continue
		case r == utf8.RuneError && !strings.HasPrefix(text[i:], "\uFFFD"):
			return line, "invalid YAML: invalid UTF-8"
		case r == '\t', r == '\r', r >= 0x20 && r <= 0x7E, r == 0x85,
			r >= 0xA0 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000:
			continue
		}
		return line, fmt.Sprintf("invalid YAML: control character %U is not allowed", r)
	}
	return 0, ""
}

// Check applies the generic constraints to every node under root, whether or
// not a schema looks at it: explicit tags only from the YAML 1.2 core schema
// (a local `!env` or a YAML 1.1 `!!binary` would make the text mean something
// its reader cannot see), no duplicate keys, no merge keys. Aliases are not
// followed; their targets are checked where they are defined. Problems come
// in document order.
func Check(root *yaml.Node) []*Error {
	var errs []*Error
	check(root, nil, &errs)
	return errs
}

// check keeps the path as segments and renders it only for a message, since
// it visits every node of what is usually a valid text.
func check(n *yaml.Node, at []segment, errs *[]*Error) {
	if n.Style&yaml.TaggedStyle != 0 {
		if problem := tagProblem(n); problem != "" {
			*errs = append(*errs, &Error{Line: n.Line, Path: render(at), Problem: problem})
		}
	}
	switch n.Kind {
	case yaml.SequenceNode:
		for i, e := range n.Content {
			check(e, append(at, segment{index: i}), errs)
		}
	case yaml.MappingNode:
		first := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := KeyText(k)
			kat := append(at, segment{key: key, index: -1})
			if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
				*errs = append(*errs, &Error{Line: k.Line, Path: render(kat), Problem: "merge keys are not supported"})
			} else if k.Kind == yaml.ScalarNode || (k.Kind == yaml.AliasNode && k.Alias.Kind == yaml.ScalarNode) {
				if line, dup := first[key]; dup {
					*errs = append(*errs, &Error{Line: k.Line, Path: render(kat),
						Problem: fmt.Sprintf("duplicate key (first at line %d)", line)})
				} else {
					first[key] = k.Line
				}
			}
			check(k, kat, errs)
			check(v, kat, errs)
		}
	}
}

// tagProblem says why an explicitly tagged node is refused, "" when it is not.
func tagProblem(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return ""
		case "!!int", "!!float", "!!bool", "!!null":
			var v any
			if n.Decode(&v) != nil {
				return fmt.Sprintf("%q is not a valid %s", n.Value, n.Tag)
			}
			return ""
		}
	case yaml.SequenceNode:
		if n.Tag == "!!seq" {
			return ""
		}
	case yaml.MappingNode:
		if n.Tag == "!!map" {
			return ""
		}
	}
	return "non-standard tag " + n.Tag
}

// segment is one step of a key path: a mapping key, or a list index when
// index ≥ 0.
type segment struct {
	key   string
	index int
}

func render(segs []segment) string {
	p := ""
	for _, s := range segs {
		if s.index >= 0 {
			p = Index(p, s.index)
		} else {
			p = Join(p, s.key)
		}
	}
	return p
}

// KeyText is the name a mapping key is known by: its literal text, so that
// `5:` and `"5":` are the same key.
func KeyText(k *yaml.Node) string {
	if k.Kind == yaml.AliasNode && k.Alias != nil {
		k = k.Alias
	}
	if k.Kind == yaml.ScalarNode {
		return k.Value
	}
	return "?"
}

// Join appends a key to a path, bracketing and quoting a key that would
// otherwise read as path syntax or be invisible.
func Join(parent, key string) string {
	if !plainKey(key) {
		return parent + "[" + strconv.Quote(key) + "]"
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func plainKey(key string) bool {
	for i := 0; i < len(key); i++ {
		b := key[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '-') {
			return false
		}
	}
	return key != ""
}

// Index appends a list index to a path.
func Index(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// Deref follows aliases so that anchors behave as if the text were repeated.
func Deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// IsNull reports a null scalar.
func IsNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Describe names what a node is, for messages: "a mapping", "a list", "null",
// "a string", "an integer", …
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!null":
		return "null"
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a float"
	case "!!bool":
		return "a boolean"
	}
	return "a " + strings.TrimLeft(n.Tag, "!")
}
