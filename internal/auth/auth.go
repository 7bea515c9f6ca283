// Package auth decides whether a request is authentic (docs/protocol/auth.md): bearer
// tokens for clients, HMAC request signatures for agents. It does no I/O and
// keeps no state, so the HTTP layer stays the only place that reads bodies,
// looks up agents and writes responses, and these rules can be tested on their
// own.
package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/wire"
)

// BearerOK reports whether an Authorization header value carries token: the
// scheme word "Bearer" in any case, exactly one space, then token byte for byte.
// An empty token never matches; running with auth off is the caller's decision.
func BearerOK(header, token string) bool {
	const scheme = "Bearer"
	if token == "" || len(header) <= len(scheme) {
		return false
	}
	if !asciiEqualFold(header[:len(scheme)], scheme) || header[len(scheme)] != ' ' {
		return false
	}
	// Hashing both sides first gives equal-length inputs, so the compare takes
	// the same time whatever the lengths and wherever the tokens differ.
	got := sha256.Sum256([]byte(header[len(scheme)+1:]))
	want := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// Request is what a signature covers.
type Request struct {
	Method string // as in the request line
	Target string // the request target exactly as in the request line (r.RequestURI), never re-encoded
	Header http.Header
	Body   []byte // the whole raw body, empty when there is none
}

// Options for Verify.
type Options struct {
	// Now is the real clock, never a test build's manual clock (docs/protocol/auth.md §3): the
	// window limits replay in wall-clock time.
	Now time.Time
	// RequireV1 refuses legacy body-only signatures (--require-v1-signatures).
	RequireV1 bool
}

// The causes Verify reports. They are for the log only: every one of them is
// answered with the same 401, so that a caller learns nothing about which
// check failed.
var (
	errSecretEmpty        = errors.New("agent secret is empty")
	errSignatureMissing   = errors.New("missing Rebuno-Signature")
	errSignatureRepeated  = errors.New("repeated Rebuno-Signature")
	errSignatureMalformed = errors.New("malformed Rebuno-Signature")
	errLegacyRefused      = errors.New("legacy sha256= signature refused: v1 required")
	errHeaderRepeated     = errors.New("signed header repeated")
	errHeaderCRLF         = errors.New("signed header contains CR or LF")
	errTimestampMissing   = errors.New("missing Rebuno-Timestamp")
	errTimestampMalformed = errors.New("malformed Rebuno-Timestamp")
	errTimestampWindow    = errors.New("timestamp outside the signature window")
	errMismatch           = errors.New("signature mismatch")
	errOccurrenceUnbound  = errors.New("Rebuno-Step-Occurrence without a valid Rebuno-Occurrence-Signature")
)

// Verify checks the Rebuno-Signature of req against secret, the agent's secret
// as UTF-8 bytes (docs/protocol/auth.md §3). It returns nil when the request is authentic;
// otherwise the error names the cause, for the log only.
func Verify(req Request, secret []byte, opt Options) error {
	// With an empty key anyone can compute the MAC; registration refuses such
	// secrets, and this keeps a bad record from opening the door.
	if len(secret) == 0 {
		return errSecretEmpty
	}

	sigs := headerValues(req.Header, wire.HeaderSignature)
	switch {
	case len(sigs) == 0:
		return errSignatureMissing
	case len(sigs) > 1:
		return errSignatureRepeated
	}

	// The rule on the signed headers is checked for legacy signatures too, so
	// that one request is never accepted with headers that v1 would refuse.
	single := func(name string) (string, bool, error) {
		vs := headerValues(req.Header, name)
		switch {
		case len(vs) == 0:
			return "", false, nil
		case len(vs) > 1:
			return "", false, fmt.Errorf("%w: %s", errHeaderRepeated, name)
		case strings.ContainsAny(vs[0], "\r\n"):
			return "", false, fmt.Errorf("%w: %s", errHeaderCRLF, name)
		}
		return vs[0], true, nil
	}
	ts, haveTS, err := single(wire.HeaderTimestamp)
	if err != nil {
		return err
	}
	dispatchID, _, err := single(wire.HeaderDispatchID)
	if err != nil {
		return err
	}
	attempt, _, err := single(wire.HeaderDispatchAttempt)
	if err != nil {
		return err
	}

	var (
		mac    [sha256.Size]byte
		signed []byte
	)
	switch sig := sigs[0]; {
	case strings.HasPrefix(sig, wire.SignaturePrefixV1):
		if !decodeMAC(sig[len(wire.SignaturePrefixV1):], &mac) {
			return errSignatureMalformed
		}
		if !haveTS {
			return errTimestampMissing
		}
		if err := checkTimestamp(ts, opt.Now); err != nil {
			return err
		}
		signed = V1Message(req.Method, req.Target, ts, dispatchID, attempt, req.Body)
	case strings.HasPrefix(sig, wire.SignaturePrefixLegacy):
		if !decodeMAC(sig[len(wire.SignaturePrefixLegacy):], &mac) {
			return errSignatureMalformed
		}
		if opt.RequireV1 {
			return errLegacyRefused
		}
		signed = req.Body
	default:
		return errSignatureMalformed
	}

	if !hmac.Equal(mac[:], sum(secret, signed)) {
		return errMismatch
	}
	return verifyOccurrence(req.Header, secret, sigs[0], single)
}

// verifyOccurrence checks that a Rebuno-Step-Occurrence, which the request
// signature does not cover, is bound to the request by its own signature:
// without it, a captured submit could be replayed with another occurrence
// and start a step its agent never asked for.
func verifyOccurrence(h http.Header, secret []byte, requestSig string, single func(string) (string, bool, error)) error {
	occurrence, present, err := single(wire.HeaderStepOccurrence)
	if err != nil || !present {
		return err
	}
	sig, present, err := single(wire.HeaderOccurrenceSignature)
	if err != nil {
		return err
	}
	var mac [sha256.Size]byte
	if !present || !strings.HasPrefix(sig, wire.SignaturePrefixV1) || !decodeMAC(sig[len(wire.SignaturePrefixV1):], &mac) {
		return errOccurrenceUnbound
	}
	if !hmac.Equal(mac[:], sum(secret, OccurrenceMessage(requestSig, occurrence))) {
		return errOccurrenceUnbound
	}
	return nil
}

// OccurrenceMessage builds the message an occurrence signature covers: the
// prefix line, the request's Rebuno-Signature value as sent, and the
// occurrence as sent, joined by LF, without a final LF.
func OccurrenceMessage(requestSig, occurrence string) []byte {
	return []byte(wire.OccurrenceMessagePrefix + "\n" + requestSig + "\n" + occurrence)
}

// SignOccurrence returns the Rebuno-Occurrence-Signature value binding
// occurrence to a request signed with requestSig.
func SignOccurrence(secret []byte, requestSig, occurrence string) string {
	return wire.SignaturePrefixV1 + hex.EncodeToString(sum(secret, OccurrenceMessage(requestSig, occurrence)))
}

// V1Message builds the message a v1 signature covers: six LF-terminated lines
// followed by the raw body. dispatchID and attempt are "" when the request
// carries no such header.
func V1Message(method, target, timestamp, dispatchID, attempt string, body []byte) []byte {
	n := len(wire.SignatureMessagePrefix) + len(method) + len(target) + len(timestamp) +
		len(dispatchID) + len(attempt) + 6 + len(body)
	m := make([]byte, 0, n)
	for _, line := range [...]string{wire.SignatureMessagePrefix, method, target, timestamp, dispatchID, attempt} {
		m = append(m, line...)
		m = append(m, '\n')
	}
	return append(m, body...)
}

// SignV1 returns the Rebuno-Signature value of a v1 request.
func SignV1(secret []byte, method, target, timestamp, dispatchID, attempt string, body []byte) string {
	return wire.SignaturePrefixV1 + hex.EncodeToString(sum(secret, V1Message(method, target, timestamp, dispatchID, attempt, body)))
}

// SignBody returns the body-only signature: the legacy request signature and
// the signature of the kernel's webhooks (docs/protocol/dispatch.md §4).
func SignBody(secret, body []byte) string {
	return wire.SignaturePrefixLegacy + hex.EncodeToString(sum(secret, body))
}

func sum(secret, msg []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(msg)
	return h.Sum(nil)
}

// decodeMAC accepts exactly 64 lowercase hex digits. encoding/hex alone would
// also take uppercase, which the protocol refuses so that every MAC has one
// spelling.
func decodeMAC(s string, dst *[sha256.Size]byte) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	_, err := hex.Decode(dst[:], []byte(s))
	return err == nil
}

// checkTimestamp accepts decimal digits only (no sign, space or other syntax
// strconv would allow) naming a second within the window around now, bounds
// included. Both sides are whole seconds, as the timestamp is.
func checkTimestamp(ts string, now time.Time) error {
	if ts == "" {
		return errTimestampMalformed
	}
	for i := 0; i < len(ts); i++ {
		if ts[i] < '0' || ts[i] > '9' {
			return errTimestampMalformed
		}
	}
	// Values beyond int64 are refused rather than wrapped, so that no long
	// digit string can land back inside the window.
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errTimestampMalformed
	}
	// The distance is taken in uint64 because the difference of two int64
	// values (a zero Now is far in the past) can overflow int64 but not uint64.
	n := now.Unix()
	var d uint64
	if t >= n {
		d = uint64(t) - uint64(n)
	} else {
		d = uint64(n) - uint64(t)
	}
	if d > wire.SignatureWindowSecs {
		return errTimestampWindow
	}
	return nil
}

// headerValues returns every value of the header name, under whatever
// spelling of the key. net/http canonicalises keys it parses, but a Header
// built by hand need not be, and a second copy hidden under another spelling
// must still count as a repetition.
func headerValues(h http.Header, name string) []string {
	var out []string
	owned := false
	for k, vs := range h {
		if len(vs) == 0 || !asciiEqualFold(k, name) {
			continue
		}
		if out == nil {
			out = vs
			continue
		}
		if !owned {
			// Appending to vs would write into the caller's header.
			out = append([]string(nil), out...)
			owned = true
		}
		out = append(out, vs...)
	}
	return out
}

// asciiEqualFold compares header names and the scheme word, which are ASCII
// tokens: strings.EqualFold would also fold non-ASCII letters such as U+017F
// onto 's'.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
