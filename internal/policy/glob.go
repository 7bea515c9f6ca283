package policy

import (
	"path"
	"strings"
	"unicode/utf8"
)

// glob is a compiled target pattern with exactly Go's path.Match semantics
// (docs/protocol/governance.md §2.4). path.Match re-parses the pattern on every call and, to report
// syntax errors, keeps scanning it after a mismatch; a bundle's patterns
// are validated once at compile time, so matching can stop at the first
// mismatch. FuzzGlob holds the two to the same answers.
type glob struct {
	pattern string
	// prefix and suffix are the literal text before the first and after
	// the last metacharacter: every match starts and ends with them, which
	// rejects most targets before any matching. Text after the last of
	// * ? [ ] \ is always literal in a valid pattern.
	prefix, suffix string
	literal        bool // no metacharacter: only byte equality matches
	chunks         []globChunk
}

// globChunk is a run of single-character operators, optionally preceded by
// a star, the unit in which path.Match works.
type globChunk struct {
	star bool
	ops  []globOp
}

type globOpKind uint8

const (
	opLiteral globOpKind = iota // bytes, compared exactly
	opAny                       // ?: one character other than /
	opClass                     // [...]: one character in (or not in) ranges
)

type globOp struct {
	kind   globOpKind
	lit    string
	negate bool
	ranges []rune // lo, hi pairs
}

// validGlob reports whether path.Match accepts the pattern. path.Match
// checks the whole pattern even when the name does not match, so matching
// against "" finds every syntax error.
func validGlob(pattern string) error {
	_, err := path.Match(pattern, "")
	return err
}

// newGlob compiles a pattern that validGlob accepted.
func newGlob(pattern string) glob {
	i := strings.IndexAny(pattern, `*?[\`)
	if i < 0 {
		return glob{pattern: pattern, prefix: pattern, literal: true}
	}
	j := strings.LastIndexAny(pattern, `*?[]\`)
	return glob{pattern: pattern, prefix: pattern[:i], suffix: pattern[j+1:], chunks: compileGlob(pattern)}
}

func compileGlob(p string) []globChunk {
	var chunks []globChunk
	for len(p) > 0 {
		var c globChunk
		for len(p) > 0 && p[0] == '*' {
			p = p[1:]
			c.star = true
		}
		var lit []byte
		flush := func() {
			if len(lit) > 0 {
				c.ops = append(c.ops, globOp{kind: opLiteral, lit: string(lit)})
				lit = nil
			}
		}
	ops:
		for len(p) > 0 {
			switch p[0] {
			case '*':
				break ops
			case '?':
				flush()
				c.ops = append(c.ops, globOp{kind: opAny})
				p = p[1:]
			case '[':
				flush()
				var op globOp
				op, p = compileClass(p[1:])
				c.ops = append(c.ops, op)
			case '\\':
				lit = append(lit, p[1])
				p = p[2:]
			default:
				lit = append(lit, p[0])
				p = p[1:]
			}
		}
		flush()
		chunks = append(chunks, c)
	}
	return chunks
}

// compileClass reads a class after its '[' and returns the rest of the
// pattern after its ']'.
func compileClass(p string) (globOp, string) {
	op := globOp{kind: opClass}
	if p[0] == '^' {
		op.negate = true
		p = p[1:]
	}
	for n := 0; ; n++ {
		if p[0] == ']' && n > 0 {
			return op, p[1:]
		}
		var lo, hi rune
		lo, p = classChar(p)
		hi = lo
		if p[0] == '-' {
			hi, p = classChar(p[1:])
		}
		op.ranges = append(op.ranges, lo, hi)
	}
}

func classChar(p string) (rune, string) {
	if p[0] == '\\' {
		p = p[1:]
	}
	r, n := utf8.DecodeRuneInString(p)
	return r, p[n:]
}

func (g *glob) match(target string) bool {
	if target == g.pattern {
		return true
	}
	if g.literal || !strings.HasPrefix(target, g.prefix) || !strings.HasSuffix(target, g.suffix) {
		return false
	}
	name := target
	for i, c := range g.chunks {
		last := i == len(g.chunks)-1
		if c.star && len(c.ops) == 0 {
			// Only the last chunk can be a bare star: it takes the
			// rest of the name unless that crosses a '/'.
			return strings.IndexByte(name, '/') < 0
		}
		if rest, ok := c.matchHere(name); ok && (rest == "" || !last) {
			name = rest
			continue
		}
		if !c.star {
			return false
		}
		// Try later starts, leftmost first, never skipping a '/'. The
		// leftmost start suffices for every chunk but the last, since
		// the next chunk has its own star to absorb what this one
		// leaves; the last must also end the name.
		found := false
		for skip := 0; skip < len(name) && name[skip] != '/'; skip++ {
			if rest, ok := c.matchHere(name[skip+1:]); ok && (rest == "" || !last) {
				name, found = rest, true
				break
			}
		}
		if !found {
			return false
		}
	}
	return name == ""
}

// matchHere matches the chunk's operators at the start of s and returns
// what follows.
func (c *globChunk) matchHere(s string) (string, bool) {
	for i := range c.ops {
		op := &c.ops[i]
		switch op.kind {
		case opLiteral:
			if !strings.HasPrefix(s, op.lit) {
				return "", false
			}
			s = s[len(op.lit):]
		case opAny:
			if s == "" || s[0] == '/' {
				return "", false
			}
			_, n := utf8.DecodeRuneInString(s)
			s = s[n:]
		case opClass:
			if s == "" {
				return "", false
			}
			r, n := utf8.DecodeRuneInString(s)
			in := false
			for j := 0; j < len(op.ranges); j += 2 {
				if op.ranges[j] <= r && r <= op.ranges[j+1] {
					in = true
					break
				}
			}
			if in == op.negate {
				return "", false
			}
			s = s[n:]
		}
	}
	return s, true
}
