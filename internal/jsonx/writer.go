package jsonx

import (
	"slices"
	"strconv"
	"strings"
)

// Object builds a JSON object that the kernel generates, such as an error
// object or an event payload. Members may be added in any order: they are
// written with keys sorted by their UTF-8 bytes, because docs/protocol/README.md §3 requires
// kernel-generated objects in canonical key order. Raw members are written
// byte for byte, which is why this exists instead of encoding/json (it
// compacts json.RawMessage, and verbatim JSON must keep its whitespace).
//
// Adding the same key twice is a programming error; Append panics on it
// rather than silently dropping a value. The zero Object is empty and ready
// to use. An Object is not safe for concurrent use.
type Object struct {
	fields []field
	// enc holds the encoded values of non-Raw members. Raw values are not
	// copied here: large verbatim values would otherwise be copied twice.
	enc []byte
}

type field struct {
	key        string
	raw        []byte // the value when set by Raw
	start, end int    // otherwise the value is enc[start:end]
}

var jsonNull = []byte("null")

func (o *Object) add(key string, start int) *Object {
	o.fields = append(o.fields, field{key: key, start: start, end: len(o.enc)})
	return o
}

// String adds a string member.
func (o *Object) String(key, val string) *Object {
	start := len(o.enc)
	o.enc = AppendString(o.enc, val)
	return o.add(key, start)
}

// Int adds an integer member.
func (o *Object) Int(key string, val int64) *Object {
	start := len(o.enc)
	o.enc = strconv.AppendInt(o.enc, val, 10)
	return o.add(key, start)
}

// Bool adds a boolean member.
func (o *Object) Bool(key string, val bool) *Object {
	start := len(o.enc)
	o.enc = strconv.AppendBool(o.enc, val)
	return o.add(key, start)
}

// Raw adds a member whose value is already-encoded JSON, written exactly as
// given; it is not validated, so it must come from Parse (Value.Raw), from
// storage of such bytes, or from another writer. Nil or empty raw is written
// as null so that a missing stored value still yields valid JSON. raw is
// retained, not copied, until the Object is written.
func (o *Object) Raw(key string, raw []byte) *Object {
	if len(raw) == 0 {
		raw = jsonNull
	}
	o.fields = append(o.fields, field{key: key, raw: raw})
	return o
}

// Strings adds an array of strings; nil or empty vals is written as [],
// because docs/protocol/README.md §3 forbids null for arrays.
func (o *Object) Strings(key string, vals []string) *Object {
	start := len(o.enc)
	o.enc = append(o.enc, '[')
	for i, s := range vals {
		if i > 0 {
			o.enc = append(o.enc, ',')
		}
		o.enc = AppendString(o.enc, s)
	}
	o.enc = append(o.enc, ']')
	return o.add(key, start)
}

// Append appends the object to dst.
func (o *Object) Append(dst []byte) []byte {
	o.sort()
	dst = append(dst, '{')
	for i := range o.fields {
		f := &o.fields[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendString(dst, f.key)
		dst = append(dst, ':')
		if f.raw != nil {
			dst = append(dst, f.raw...)
		} else {
			dst = append(dst, o.enc[f.start:f.end]...)
		}
	}
	return append(dst, '}')
}

// Bytes returns the encoded object.
func (o *Object) Bytes() []byte {
	n := 2 + len(o.enc)
	for i := range o.fields {
		n += len(o.fields[i].key) + 4 + len(o.fields[i].raw)
	}
	return o.Append(make([]byte, 0, n))
}

// sort orders the fields by key in place; the order in which members were
// added carries no meaning, so nothing is lost.
func (o *Object) sort() {
	fs := o.fields
	if len(fs) <= 12 {
		for i := 1; i < len(fs); i++ {
			for j := i; j > 0 && fs[j].key < fs[j-1].key; j-- {
				fs[j], fs[j-1] = fs[j-1], fs[j]
			}
		}
	} else {
		slices.SortFunc(fs, func(a, b field) int { return strings.Compare(a.key, b.key) })
	}
	for i := 1; i < len(fs); i++ {
		if fs[i].key == fs[i-1].key {
			panic("jsonx: duplicate key " + strconv.Quote(fs[i].key) + " in Object")
		}
	}
}
