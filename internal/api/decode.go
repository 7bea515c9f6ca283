package api

import (
	"errors"
	"strconv"
	"strings"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

var invalid = kernel.Validation

// fields reads the members of a JSON request body with the rules of docs/protocol/http.md §5:
// unknown members are refused, kernel-defined members must have their type,
// and null is the same as absence.
type fields struct {
	obj *jsonx.Value
	err error
}

// parseBody parses a request body that must be one JSON object and names
// only the given fields.
func parseBody(body []byte, known ...string) (*fields, error) {
	if len(body) == 0 {
		return nil, invalid("", "request body is empty")
	}
	v, err := jsonx.Parse(body, wire.MaxNesting)
	if err != nil {
		var je *jsonx.Error
		if errors.As(err, &je) && je.Path != "" {
			return nil, invalid(je.Path, "%s", je.Msg)
		}
		return nil, invalid("", "%s", err.Error())
	}
	if v.Kind != jsonx.KindObject {
		return nil, invalid("", "request body must be a JSON object")
	}
	for _, m := range v.Members {
		if !contains(known, m.Key) {
			return nil, invalid(m.Key, "unknown field %q", m.Key)
		}
	}
	return &fields{obj: v}, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// get returns the member, nil when absent or null.
func (f *fields) get(name string) *jsonx.Value {
	v := f.obj.Get(name)
	if v == nil || v.Kind == jsonx.KindNull {
		return nil
	}
	return v
}

func (f *fields) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

func (f *fields) str(name string) string {
	v := f.get(name)
	if v == nil {
		return ""
	}
	if v.Kind != jsonx.KindString {
		f.fail(invalid(name, "%s must be a string", name))
		return ""
	}
	return v.Str
}

// raw returns any JSON value verbatim, nil when absent or null.
func (f *fields) raw(name string) []byte {
	if v := f.get(name); v != nil {
		return v.Raw
	}
	return nil
}

func (f *fields) value(name string) *jsonx.Value { return f.get(name) }

func (f *fields) integer(name string, lo, hi int64) (int64, bool) {
	v := f.get(name)
	if v == nil {
		return 0, false
	}
	if v.Kind != jsonx.KindNumber {
		f.fail(invalid(name, "%s must be an integer", name))
		return 0, false
	}
	n, err := strconv.ParseInt(string(v.Raw), 10, 64)
	if err != nil || n < lo || n > hi {
		f.fail(invalid(name, "%s must be an integer from %d to %d", name, lo, hi))
		return 0, false
	}
	return n, true
}

func (f *fields) boolean(name string) bool {
	v := f.get(name)
	if v == nil {
		return false
	}
	if v.Kind != jsonx.KindBool {
		f.fail(invalid(name, "%s must be a boolean", name))
		return false
	}
	return v.Bool
}

func (f *fields) strings(name string) ([]string, bool) {
	v := f.get(name)
	if v == nil {
		return nil, false
	}
	if v.Kind != jsonx.KindArray {
		f.fail(invalid(name, "%s must be an array of strings", name))
		return nil, false
	}
	out := make([]string, 0, len(v.Elems))
	for _, e := range v.Elems {
		if e.Kind != jsonx.KindString {
			f.fail(invalid(name, "%s must be an array of strings", name))
			return nil, false
		}
		out = append(out, e.Str)
	}
	return out, true
}

// object returns a member that must be a JSON object, verbatim.
func (f *fields) object(name string) []byte {
	v := f.get(name)
	if v == nil {
		return nil
	}
	if v.Kind != jsonx.KindObject {
		f.fail(invalid(name, "%s must be a JSON object", name))
		return nil
	}
	return v.Raw
}

// ---- path, query and header parameters (docs/protocol/http.md §6) ----

// parseUUID accepts the 8-4-4-4-12 form in either case and lowercases it.
func parseUUID(field, s string) (string, error) {
	if len(s) != 36 {
		return "", invalid(field, "%s must be a UUID", field)
	}
	b := []byte(s)
	for i, c := range b {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", invalid(field, "%s must be a UUID", field)
			}
			continue
		}
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			b[i] = c + ('a' - 'A')
		default:
			return "", invalid(field, "%s must be a UUID", field)
		}
	}
	return string(b), nil
}

func validStepID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// parseInt parses a decimal integer with an optional leading '-'.
func parseInt(field, s string) (int64, error) {
	t := strings.TrimPrefix(s, "-")
	if t == "" {
		return 0, invalid(field, "%s must be an integer", field)
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return 0, invalid(field, "%s must be an integer", field)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, invalid(field, "%s is out of range", field)
	}
	return n, nil
}

// query reads single-valued query parameters: a repeated parameter is an
// error and an empty value is the same as absence.
func (c *call) query(name string) (string, error) {
	vals := c.r.URL.Query()[name]
	if len(vals) > 1 {
		return "", invalid(name, "%s is repeated", name)
	}
	if len(vals) == 0 {
		return "", nil
	}
	return vals[0], nil
}

func (c *call) queryInt(name string) (int64, bool, error) {
	s, err := c.query(name)
	if err != nil || s == "" {
		return 0, false, err
	}
	n, err := parseInt(name, s)
	if err != nil {
		return 0, false, err
	}
	if n < 0 {
		return 0, false, invalid(name, "%s must not be negative", name)
	}
	return n, true, nil
}

// dispatchHeaders reads the optional dispatch headers (docs/protocol/http.md §10).
func (c *call) dispatchHeaders() (kernel.DispatchHeaders, error) {
	var h kernel.DispatchHeaders
	if vals := c.r.Header.Values(wire.HeaderDispatchID); len(vals) > 0 {
		if len(vals) > 1 {
			return h, invalid(wire.HeaderDispatchID, "%s is repeated", wire.HeaderDispatchID)
		}
		id, err := parseUUID(wire.HeaderDispatchID, vals[0])
		if err != nil {
			return h, err
		}
		h.ID = id
	}
	if vals := c.r.Header.Values(wire.HeaderDispatchAttempt); len(vals) > 0 {
		n, err := headerInt(wire.HeaderDispatchAttempt, vals, 1)
		if err != nil {
			return h, err
		}
		h.Attempt = n
	}
	return h, nil
}

// headerInt parses a header holding a decimal integer from lo to 2^31-1.
func headerInt(name string, vals []string, lo int64) (int64, error) {
	if len(vals) > 1 {
		return 0, invalid(name, "%s is repeated", name)
	}
	s := vals[0]
	if s == "" || len(s) > 10 {
		return 0, invalid(name, "%s must be an integer from %d to 2147483647", name, lo)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, invalid(name, "%s must be an integer from %d to 2147483647", name, lo)
		}
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	if n < lo || n > 2147483647 {
		return 0, invalid(name, "%s must be an integer from %d to 2147483647", name, lo)
	}
	return n, nil
}
