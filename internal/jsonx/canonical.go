package jsonx

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// Canonical returns the canonical form of v (docs/protocol/identity.md §2), the bytes that step
// identity hashes. A nil v is JSON null, because absent args and null args
// must hash alike.
//
// Numbers are written from Raw, so a hand-built number Value needs Raw set.
// If a hand-built object repeats a key, the last occurrence is kept, as docs/protocol/identity.md §2
// prescribes for standalone implementations; Parse never produces one.
func Canonical(v *Value) []byte {
	n := 4
	if v != nil {
		n = len(v.Raw)
	}
	return AppendCanonical(make([]byte, 0, n), v)
}

// AppendCanonical appends the canonical form of v to dst; see Canonical.
func AppendCanonical(dst []byte, v *Value) []byte {
	if v == nil {
		return append(dst, "null"...)
	}
	switch v.Kind {
	case KindBool:
		if v.Bool {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case KindNumber:
		return append(dst, v.Raw...)
	case KindString:
		return AppendString(dst, v.Str)
	case KindArray:
		dst = append(dst, '[')
		for i, e := range v.Elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendCanonical(dst, e)
		}
		return append(dst, ']')
	case KindObject:
		return appendCanonicalObject(dst, v.Members)
	}
	return append(dst, "null"...)
}

func appendCanonicalObject(dst []byte, mem []Member) []byte {
	dst = append(dst, '{')
	if keysAscending(mem) {
		// Already canonical order (for example when re-canonicalising stored
		// canonical JSON): no permutation needed.
		for i := range mem {
			dst = appendMember(dst, i > 0, &mem[i])
		}
		return append(dst, '}')
	}
	// Sort a permutation rather than the members: Members is the caller's
	// input-order view and must not change. Go compares strings bytewise,
	// which is exactly the UTF-8 byte order docs/protocol/identity.md §2 asks for. The sort is
	// stable so that, among repeated keys, the last in input order is last.
	var small [16]int32
	order := small[:0]
	if len(mem) > len(small) {
		order = make([]int32, 0, len(mem))
	}
	for i := range mem {
		order = append(order, int32(i))
	}
	if len(order) <= len(small) {
		for i := 1; i < len(order); i++ {
			for j := i; j > 0 && mem[order[j]].Key < mem[order[j-1]].Key; j-- {
				order[j], order[j-1] = order[j-1], order[j]
			}
		}
	} else {
		slices.SortStableFunc(order, func(a, b int32) int {
			return strings.Compare(mem[a].Key, mem[b].Key)
		})
	}
	first := true
	for k, i := range order {
		if k+1 < len(order) && mem[order[k+1]].Key == mem[i].Key {
			continue
		}
		dst = appendMember(dst, !first, &mem[i])
		first = false
	}
	return append(dst, '}')
}

func keysAscending(mem []Member) bool {
	for i := 1; i < len(mem); i++ {
		if mem[i-1].Key >= mem[i].Key {
			return false
		}
	}
	return true
}

func appendMember(dst []byte, comma bool, m *Member) []byte {
	if comma {
		dst = append(dst, ',')
	}
	dst = AppendString(dst, m.Key)
	dst = append(dst, ':')
	return AppendCanonical(dst, m.Value)
}

// CanonicalBytes parses data as Parse does and returns its canonical form.
func CanonicalBytes(data []byte, maxDepth int) ([]byte, error) {
	v, err := Parse(data, maxDepth)
	if err != nil {
		return nil, err
	}
	return Canonical(v), nil
}

// Stringify turns a value into the text that policy argument predicates
// compare (docs/protocol/governance.md §2.5). It deliberately avoids any language's number or
// collection formatting so that every implementation agrees.
func Stringify(v *Value) string {
	if v == nil {
		return "null"
	}
	switch v.Kind {
	case KindString:
		return v.Str
	case KindNumber:
		return string(v.Raw)
	case KindBool:
		if v.Bool {
			return "true"
		}
		return "false"
	case KindArray, KindObject:
		return string(Canonical(v))
	}
	return "null"
}

const lowerHex = "0123456789abcdef"

// asciiPlain marks the ASCII bytes that AppendString copies unchanged.
var asciiPlain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// AppendString appends s as a JSON string using exactly the escaping of
// docs/protocol/identity.md §2, so that strings the kernel writes itself and strings in canonical
// JSON look the same. Any invalid UTF-8 in s is written as U+FFFD: the output
// must be valid JSON, and strings from Parse never contain any.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending, to be copied in one append
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if asciiPlain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default: // other control characters and < > &
				dst = append(dst, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
		case r == '\u2028' || r == '\u2029':
			// Escaped because they end lines in JavaScript source.
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', lowerHex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
