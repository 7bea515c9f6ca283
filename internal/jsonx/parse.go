// Package jsonx is the kernel's JSON layer: a strict parser that keeps the
// exact input bytes of every value (user JSON is stored verbatim, docs/protocol/README.md §3), the
// canonical form that step identity hashes (docs/protocol/identity.md §2), and a small writer for the
// objects the kernel generates around those verbatim values.
//
// encoding/json is not used for any of this: it accepts duplicate keys and
// invalid UTF-8, converts numbers unless told not to, and compacts
// json.RawMessage on output.
package jsonx

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is the JSON type of a Value. The zero Kind is KindNull so that a zero
// Value reads as JSON null.
type Kind uint8

const (
	KindNull Kind = iota
	KindBool
	KindNumber
	KindString
	KindArray
	KindObject
)

// String names the kind the way validation messages talk about JSON types.
func (k Kind) String() string {
	switch k {
	case KindNull:
		return "null"
	case KindBool:
		return "boolean"
	case KindNumber:
		return "number"
	case KindString:
		return "string"
	case KindArray:
		return "array"
	case KindObject:
		return "object"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is one parsed JSON value. Raw aliases the input given to Parse, so
// the input must not be modified while the Value is in use.
type Value struct {
	Kind Kind
	Bool bool // KindBool; next to Kind so that the two share one word
	// Raw is the exact input text of the value without surrounding
	// whitespace. Its capacity is clipped, so appending to it cannot
	// overwrite the input.
	Raw     []byte
	Str     string   // KindString: the decoded text
	Members []Member // KindObject, in input order
	Elems   []*Value // KindArray
}

// Member is one object member; Key is the decoded key.
type Member struct {
	Key   string
	Value *Value
}

// Get returns the value of the member named key, or nil when v is not an
// object or has no such member. It is a linear scan: kernel-defined objects
// are small, and building an index would cost more than it saves.
func (v *Value) Get(key string) *Value {
	if v == nil || v.Kind != KindObject {
		return nil
	}
	for i := range v.Members {
		if v.Members[i].Key == key {
			return v.Members[i].Value
		}
	}
	return nil
}

// Error describes why Parse refused its input. Path locates the offending
// value or container (`args.items[3]`, empty at the top level) so that a
// client can find the problem without counting bytes; Offset is the byte
// offset of the offending input.
type Error struct {
	Offset int
	Path   string
	Msg    string
}

func (e *Error) Error() string {
	if e.Path != "" {
		return e.Msg + " at " + e.Path
	}
	return e.Msg + " at offset " + strconv.Itoa(e.Offset)
}

// Parse parses exactly one JSON value (RFC 8259), optionally surrounded by
// space, tab, LF or CR. It is stricter than the RFC requires, as docs/protocol/http.md §5 asks:
// invalid UTF-8 anywhere, duplicate keys (compared after decoding) in any
// object, and more than maxDepth nested arrays/objects are all refused.
// Numbers are checked against the grammar but never converted, so any
// magnitude is accepted and Raw keeps the literal.
//
// The returned error is always an *Error.
func Parse(data []byte, maxDepth int) (*Value, error) {
	sc := scratchPool.Get().(*scratch)
	p := parser{data: data, maxDepth: maxDepth, scratch: sc}
	v, err := p.parse()
	p.release()
	if err != nil {
		// A nil *Error must not become a non-nil error interface.
		return nil, err
	}
	return v, nil
}

// frame is an array or object that is still open. The parser keeps these on
// an explicit stack rather than recursing, so that no maxDepth a caller picks
// can exhaust the goroutine stack.
type frame struct {
	v     *Value
	start int // offset of the opening bracket
	base  int // where this container's children start in parser.elems / parser.members
	n     int // children attached so far; also the index of the element being parsed
	key   string
	// seen indexes the keys of a large object so that duplicate detection
	// stays linear; small objects are scanned instead, which is cheaper.
	seen map[string]struct{}
}

// dupScanLimit is the member count above which an object gets a key index.
const dupScanLimit = 16

type parser struct {
	data     []byte
	maxDepth int
	*scratch
	// Slabs: Values and child slices are carved out of shared chunks to keep
	// the allocation count proportional to log(size) rather than to the
	// number of values. They belong to the result, so they are never reused.
	valSlab []Value
	ptrSlab []*Value
	memSlab []Member
}

// scratch is the parser state that does not outlive a parse. It is pooled
// because nearly every request parses a body, and regrowing these slices for
// each one costs more allocations than the Values themselves.
type scratch struct {
	stack []frame
	// Children of open containers accumulate here and are moved into
	// exactly-sized slices when the container closes, so no per-container
	// slice is ever grown by append.
	elems   []*Value
	members []Member
	buf     []byte // for strings that contain escapes
	// interned holds recently made short strings. Keys and enum-like values
	// repeat a lot (within a document: every element of an array of objects
	// has the same keys; across requests: the same field names), and reusing
	// them removes most string allocations without letting a small string
	// pin a whole input the way slicing one big copy of it would.
	interned [64]string
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// maxPooledScratch bounds the length of each pooled slice, so that one huge
// document does not pin its scratch space for the life of the process.
const maxPooledScratch = 4096

// release returns the scratch space to the pool. After an error the stacks
// still hold pointers into the abandoned result; they are cleared so the pool
// does not keep that garbage alive.
func (p *parser) release() {
	sc := p.scratch
	p.scratch = nil
	clear(sc.stack[:len(sc.stack)])
	clear(sc.elems[:len(sc.elems)])
	clear(sc.members[:len(sc.members)])
	sc.stack, sc.elems, sc.members, sc.buf = sc.stack[:0], sc.elems[:0], sc.members[:0], sc.buf[:0]
	if max(cap(sc.stack), cap(sc.elems), cap(sc.members), cap(sc.buf)/16) > maxPooledScratch {
		return
	}
	scratchPool.Put(sc)
}

const internMaxLen = 32

// makeString returns b as a string, reusing an interned copy when it can.
func (p *scratch) makeString(b []byte) string {
	if len(b) > internMaxLen {
		return string(b)
	}
	// A few bytes and the length tell typical keys apart well enough; a
	// collision only costs an allocation.
	h := uint32(len(b))
	if len(b) > 0 {
		h = h*31 + uint32(b[0])
		h = h*31 + uint32(b[len(b)/2])
		h = h*31 + uint32(b[len(b)-1])
	}
	slot := &p.interned[(h*2654435761)>>26]
	if *slot == string(b) { // compared without allocating
		return *slot
	}
	s := string(b)
	*slot = s
	return s
}

func (p *parser) parse() (*Value, *Error) {
	data := p.data
	if len(data) == 0 {
		return nil, &Error{Msg: "empty input"}
	}
	// A value takes 13 to 25 input bytes in typical JSON; erring low costs
	// one more chunk, erring high costs zeroing and scanning unused Values.
	p.valSlab = make([]Value, 0, clamp(len(data)/20, 4, 2048))
	i := 0
	for {
		// Parse the value that starts at or after i.
		i = skipWS(data, i)
		if i >= len(data) {
			return nil, p.errAt(i, true, "unexpected end of input")
		}
		var v *Value
		switch c := data[i]; c {
		case '{', '[':
			if len(p.stack) >= p.maxDepth {
				return nil, p.errAt(i, true, "nesting deeper than "+strconv.Itoa(p.maxDepth))
			}
			cv := p.newValue()
			base := len(p.elems)
			cv.Kind = KindArray
			if c == '{' {
				cv.Kind = KindObject
				base = len(p.members)
			}
			p.stack = append(p.stack, frame{v: cv, start: i, base: base})
			i = skipWS(data, i+1)
			if c == '{' {
				if i < len(data) && data[i] == '}' {
					v = p.closeContainer(i)
					i++
					break
				}
				var err *Error
				if i, err = p.memberKey(i); err != nil {
					return nil, err
				}
				continue
			}
			if i < len(data) && data[i] == ']' {
				v = p.closeContainer(i)
				i++
				break
			}
			continue
		case '"':
			s, end, err := p.str(i)
			if err != nil {
				return nil, err
			}
			v = p.newValue()
			v.Kind = KindString
			v.Str = s
			v.Raw = data[i:end:end]
			i = end
		case 't', 'f', 'n':
			lit := "null"
			if c == 't' {
				lit = "true"
			} else if c == 'f' {
				lit = "false"
			}
			end := i + len(lit)
			if end > len(data) || string(data[i:end]) != lit {
				return nil, p.errAt(i, true, "invalid literal")
			}
			v = p.newValue()
			if c != 'n' {
				v.Kind = KindBool
				v.Bool = c == 't'
			}
			v.Raw = data[i:end:end]
			i = end
		default:
			if c != '-' && (c < '0' || c > '9') {
				return nil, p.errAt(i, true, p.unexpected(i))
			}
			end, err := p.number(i)
			if err != nil {
				return nil, err
			}
			v = p.newValue()
			v.Kind = KindNumber
			v.Raw = data[i:end:end]
			i = end
		}

		// v is complete: attach it to its container, closing every container
		// that ends right after it, until one expects another value.
		for {
			if len(p.stack) == 0 {
				i = skipWS(data, i)
				if i != len(data) {
					return nil, p.errAt(i, false, "unexpected data after the value")
				}
				return v, nil
			}
			top := &p.stack[len(p.stack)-1]
			top.n++
			isObj := top.v.Kind == KindObject
			closer := byte(']')
			if isObj {
				p.members = append(p.members, Member{Key: top.key, Value: v})
				closer = '}'
			} else {
				p.elems = append(p.elems, v)
			}
			i = skipWS(data, i)
			if i >= len(data) {
				return nil, p.errAt(i, false, "unexpected end of input")
			}
			if data[i] == closer {
				v = p.closeContainer(i)
				i++
				continue
			}
			if data[i] != ',' {
				return nil, p.errAt(i, false, "expected ',' or '"+string(closer)+"'")
			}
			i++
			if isObj {
				var err *Error
				if i, err = p.memberKey(skipWS(data, i)); err != nil {
					return nil, err
				}
			}
			break
		}
	}
}

// memberKey parses `"key" :` at i for the object on top of the stack,
// rejecting a key the object already has, and returns the offset after the
// colon.
func (p *parser) memberKey(i int) (int, *Error) {
	data := p.data
	if i >= len(data) {
		return i, p.errAt(i, false, "unexpected end of input")
	}
	if data[i] != '"' {
		return i, p.errAt(i, false, "expected a string key")
	}
	key, end, err := p.str(i)
	if err != nil {
		// str reports errors as inside a member value; inside a key the path
		// must stop at the object.
		return i, p.errAt(err.Offset, false, err.Msg)
	}
	top := &p.stack[len(p.stack)-1]
	if top.seen != nil {
		if _, dup := top.seen[key]; dup {
			return i, p.errAt(i, false, "duplicate key "+quoteForMsg(key))
		}
		top.seen[key] = struct{}{}
	} else {
		existing := p.members[top.base:]
		for j := range existing {
			if existing[j].Key == key {
				return i, p.errAt(i, false, "duplicate key "+quoteForMsg(key))
			}
		}
		if len(existing) >= dupScanLimit {
			top.seen = make(map[string]struct{}, 2*len(existing))
			for j := range existing {
				top.seen[existing[j].Key] = struct{}{}
			}
			top.seen[key] = struct{}{}
		}
	}
	i = skipWS(data, end)
	if i >= len(data) {
		return i, p.errAt(i, false, "unexpected end of input")
	}
	if data[i] != ':' {
		return i, p.errAt(i, false, "expected ':'")
	}
	top.key = key
	return i + 1, nil
}

// closeContainer finishes the container on top of the stack, whose closing
// bracket is at i, and pops it.
func (p *parser) closeContainer(i int) *Value {
	top := &p.stack[len(p.stack)-1]
	v := top.v
	v.Raw = p.data[top.start : i+1 : i+1]
	if v.Kind == KindObject {
		if n := len(p.members) - top.base; n > 0 {
			v.Members = p.allocMembers(n)
			copy(v.Members, p.members[top.base:])
			clear(p.members[top.base:]) // do not pin values through the scratch stack
			p.members = p.members[:top.base]
		}
	} else if n := len(p.elems) - top.base; n > 0 {
		v.Elems = p.allocPtrs(n)
		copy(v.Elems, p.elems[top.base:])
		clear(p.elems[top.base:])
		p.elems = p.elems[:top.base]
	}
	*top = frame{}
	p.stack = p.stack[:len(p.stack)-1]
	return v
}

func (p *parser) newValue() *Value {
	if len(p.valSlab) == cap(p.valSlab) {
		p.valSlab = make([]Value, 0, min(2*cap(p.valSlab), 8192))
	}
	p.valSlab = p.valSlab[:len(p.valSlab)+1]
	return &p.valSlab[len(p.valSlab)-1]
}

func (p *parser) allocPtrs(n int) []*Value {
	if cap(p.ptrSlab)-len(p.ptrSlab) < n {
		p.ptrSlab = make([]*Value, 0, max(n, min(2*cap(p.ptrSlab), 4096), 16))
	}
	l := len(p.ptrSlab)
	p.ptrSlab = p.ptrSlab[:l+n]
	return p.ptrSlab[l : l+n : l+n]
}

func (p *parser) allocMembers(n int) []Member {
	if cap(p.memSlab)-len(p.memSlab) < n {
		p.memSlab = make([]Member, 0, max(n, min(2*cap(p.memSlab), 2048), len(p.data)/32))
	}
	l := len(p.memSlab)
	p.memSlab = p.memSlab[:l+n]
	return p.memSlab[l : l+n : l+n]
}

// strPlain marks the bytes a string can contain without a closer look:
// printable ASCII other than the quote and the backslash.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plain8 reports whether all eight bytes of x are in strPlain, using the
// classic "has a zero byte" bit trick: (v - 0x01…) &^ v & 0x80… is non-zero
// exactly when some byte of v is zero.
func plain8(x uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	hasZero := func(v uint64) uint64 { return (v - ones) &^ v & highs }
	control := (x - 0x20*ones) &^ x & highs // some byte < 0x20 (given no byte >= 0x80)
	return (x&highs | control | hasZero(x^'"'*ones) | hasZero(x^'\\'*ones)) == 0
}

// str parses the string whose opening quote is at i and returns its decoded
// text and the offset after the closing quote.
func (p *parser) str(i int) (string, int, *Error) {
	data := p.data
	j := i + 1
	for j < len(data) {
		// Long strings (message texts, documents) are mostly plain ASCII:
		// test eight bytes at a time.
		for j+8 <= len(data) && plain8(binary.LittleEndian.Uint64(data[j:])) {
			j += 8
		}
		if j >= len(data) {
			break
		}
		c := data[j]
		if strPlain[c] {
			j++
			continue
		}
		switch {
		case c == '"':
			return p.makeString(data[i+1 : j]), j + 1, nil
		case c == '\\':
			return p.strEscaped(i, j)
		case c < 0x20:
			return "", j, p.errAt(j, true, "control character "+runeName(rune(c))+" in string")
		default:
			r, size := utf8.DecodeRune(data[j:])
			if r == utf8.RuneError && size == 1 {
				return "", j, p.errAt(j, true, "invalid UTF-8")
			}
			j += size
		}
	}
	return "", j, p.errAt(j, true, "unterminated string")
}

// strEscaped continues str from the first backslash at j, decoding into the
// scratch buffer; only strings with escapes pay for the extra copy.
func (p *parser) strEscaped(i, j int) (string, int, *Error) {
	data := p.data
	buf := append(p.buf[:0], data[i+1:j]...)
	defer func() { p.buf = buf }()
	for j < len(data) {
		c := data[j]
		if strPlain[c] {
			// Copy the whole plain run at once.
			k := j + 1
			for k < len(data) && strPlain[data[k]] {
				k++
			}
			buf = append(buf, data[j:k]...)
			j = k
			continue
		}
		switch {
		case c == '"':
			return p.makeString(buf), j + 1, nil
		case c == '\\':
			if j+1 >= len(data) {
				return "", j, p.errAt(j+1, true, "unterminated string")
			}
			e := data[j+1]
			switch e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, ok := hex4(data, j+2)
				if !ok {
					return "", j, p.errAt(j, true, "invalid \\u escape")
				}
				j += 6
				if utf16.IsSurrogate(r) {
					// Only a high surrogate immediately followed by an escaped
					// low one is a pair; anything else is a lone surrogate,
					// which docs/protocol/http.md §5 accepts and decodes as U+FFFD.
					r2, ok := rune(0), false
					if r < 0xdc00 && j+1 < len(data) && data[j] == '\\' && data[j+1] == 'u' {
						r2, ok = hex4(data, j+2)
					}
					if ok && r2 >= 0xdc00 && r2 <= 0xdfff {
						r = utf16.DecodeRune(r, r2)
						j += 6
					} else {
						r = utf8.RuneError
					}
				}
				buf = utf8.AppendRune(buf, r)
				continue
			default:
				return "", j, p.errAt(j, true, "invalid escape "+strconv.Quote(string(rune(e))))
			}
			j += 2
		case c < 0x20:
			return "", j, p.errAt(j, true, "control character "+runeName(rune(c))+" in string")
		default:
			r, size := utf8.DecodeRune(data[j:])
			if r == utf8.RuneError && size == 1 {
				return "", j, p.errAt(j, true, "invalid UTF-8")
			}
			buf = append(buf, data[j:j+size]...)
			j += size
		}
	}
	return "", j, p.errAt(j, true, "unterminated string")
}

// hex4 reads the four hex digits of a \u escape at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number checks the RFC 8259 number grammar from i and returns the end
// offset. The text is never converted: docs/protocol/identity.md §2 hashes the literal as written.
func (p *parser) number(i int) (int, *Error) {
	data := p.data
	j := i
	if data[j] == '-' {
		j++
	}
	switch {
	case j < len(data) && data[j] == '0':
		j++
		if j < len(data) && isDigit(data[j]) {
			return j, p.errAt(i, true, "invalid number: leading zero")
		}
	case j < len(data) && isDigit(data[j]):
		j = digits(data, j)
	default:
		return j, p.errAt(i, true, "invalid number")
	}
	if j < len(data) && data[j] == '.' {
		j++
		if j >= len(data) || !isDigit(data[j]) {
			return j, p.errAt(i, true, "invalid number: no digit after '.'")
		}
		j = digits(data, j)
	}
	if j < len(data) && (data[j] == 'e' || data[j] == 'E') {
		j++
		if j < len(data) && (data[j] == '+' || data[j] == '-') {
			j++
		}
		if j >= len(data) || !isDigit(data[j]) {
			return j, p.errAt(i, true, "invalid number: no digit in exponent")
		}
		j = digits(data, j)
	}
	return j, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func digits(data []byte, j int) int {
	for j < len(data) && isDigit(data[j]) {
		j++
	}
	return j
}

func skipWS(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func clamp(v, lo, hi int) int { return min(max(v, lo), hi) }

// unexpected describes a byte that cannot start a value. Invalid UTF-8 is
// named as such because docs/protocol/http.md §5 lists it as its own rule.
func (p *parser) unexpected(i int) string {
	c := p.data[i]
	if c < utf8.RuneSelf {
		return "unexpected character " + runeName(rune(c))
	}
	r, size := utf8.DecodeRune(p.data[i:])
	if r == utf8.RuneError && size == 1 {
		return "invalid UTF-8"
	}
	return "unexpected character " + runeName(r)
}

func runeName(r rune) string {
	if r >= 0x20 && r < 0x7f {
		return strconv.QuoteRune(r)
	}
	const hexDigits = "0123456789ABCDEF"
	b := []byte("U+")
	for shift := max(16, 4*((bits.Len32(uint32(r))+3)/4)) - 4; shift >= 0; shift -= 4 {
		b = append(b, hexDigits[r>>shift&0xf])
	}
	return string(b)
}

// errAt builds the error for offset i. inChild says whether the parser was
// inside a value of the innermost open container (its key or index belongs in
// the path) or between its members (the path names the container itself).
func (p *parser) errAt(i int, inChild bool, msg string) *Error {
	var path []byte
	for k := range p.stack {
		f := &p.stack[k]
		if k == len(p.stack)-1 && !inChild {
			break
		}
		if f.v.Kind == KindArray {
			path = append(path, '[')
			path = strconv.AppendInt(path, int64(f.n), 10)
			path = append(path, ']')
			continue
		}
		if isPlainKey(f.key) {
			if len(path) > 0 {
				path = append(path, '.')
			}
			path = append(path, f.key...)
		} else {
			path = append(path, '[')
			path = append(path, quoteForMsg(f.key)...)
			path = append(path, ']')
		}
	}
	return &Error{Offset: i, Path: string(path), Msg: msg}
}

// isPlainKey reports whether key can be shown in a path without quoting.
func isPlainKey(key string) bool {
	if key == "" || len(key) > 64 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c == '_' || c == '-' || isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'z')) {
			return false
		}
	}
	return true
}

// quoteForMsg quotes a key for an error message, shortening it so that a
// hostile multi-megabyte key cannot blow up the error response.
func quoteForMsg(key string) string {
	const limit = 64
	if len(key) <= limit {
		return string(AppendString(nil, key))
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return string(AppendString(nil, key[:cut]+"…"))
}
