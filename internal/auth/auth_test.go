package auth

import (
	"errors"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/testvectors"
	"github.com/rebuno/rebuno/internal/wire"
)

// The request signature vectors of docs/protocol/vectors (signatures.json),
// which the Python and TypeScript SDK tests read too: submit, a GET with a
// query, and a heartbeat without an attempt, all with the same secret.
var (
	sigVectors = testvectors.LoadSignatures().Requests
	testSecret = sigVectors[0].Secret
	vecTS      = sigVectors[0].Timestamp
	vecDID     = sigVectors[0].DID()
	vec1Body   = sigVectors[0].Body
	vec1Sig    = sigVectors[0].Signature
	vec1Legacy = sigVectors[0].LegacySignature
	vec2Sig    = sigVectors[1].Signature
	vec3Sig    = sigVectors[2].Signature
	// execPath is the execution path every vector's target starts with.
	execPath = strings.TrimSuffix(sigVectors[0].Target, "/steps")
)

var (
	secret = []byte(testSecret)
	vecNow = time.Unix(1700000000, 0)
)

// fields describes a v1 request; an empty header field means the header is
// absent.
type fields struct {
	method, target, ts, did, att string
	body                         []byte
}

var (
	vec1 = vectorFields(sigVectors[0])
	vec2 = vectorFields(sigVectors[1])
	vec3 = vectorFields(sigVectors[2])
)

func vectorFields(v testvectors.Request) fields {
	var body []byte
	if v.Body != "" {
		body = []byte(v.Body)
	}
	return fields{v.Method, v.Target, v.Timestamp, v.DID(), v.Attempt(), body}
}

func (f fields) message() []byte {
	return V1Message(f.method, f.target, f.ts, f.did, f.att, f.body)
}

// request builds the request with the given signature. Header values are
// stored as they are, without the checks http.Header.Set would not make
// anyway, so that tests control every byte.
func (f fields) request(sig string) Request {
	h := http.Header{}
	for name, v := range map[string]string{
		wire.HeaderTimestamp:       f.ts,
		wire.HeaderDispatchID:      f.did,
		wire.HeaderDispatchAttempt: f.att,
		wire.HeaderSignature:       sig,
		wire.HeaderAgentID:         "agent-1",
	} {
		if v != "" {
			h[name] = []string{v}
		}
	}
	return Request{Method: f.method, Target: f.target, Header: h, Body: f.body}
}

// signed returns the request carrying a correct v1 signature of its own
// fields, so that a refusal can only come from the rule a test is about.
func (f fields) signed() Request {
	return f.request(SignV1(secret, f.method, f.target, f.ts, f.did, f.att, f.body))
}

func TestRequestSignatureVectors(t *testing.T) {
	if len(sigVectors) != 3 || vec1Legacy == "" {
		t.Fatalf("signatures.json: %d request vectors", len(sigVectors))
	}
	for _, v := range sigVectors {
		t.Run(v.Name, func(t *testing.T) {
			if v.Secret != testSecret || v.Timestamp != vecTS {
				t.Fatalf("the vectors share one secret and timestamp")
			}
			f := vectorFields(v)
			msg := f.message()
			if string(msg) != v.Message {
				t.Errorf("message = %q\nwant      %q", msg, v.Message)
			}
			if len(msg) != v.MessageLength {
				t.Errorf("message length = %d, want %d", len(msg), v.MessageLength)
			}
			if got := SignV1(secret, f.method, f.target, f.ts, f.did, f.att, f.body); got != v.Signature {
				t.Errorf("SignV1 = %s, want %s", got, v.Signature)
			}

			req := f.request(v.Signature)
			for _, off := range []int64{-300, -1, 0, 1, 300} {
				opt := Options{Now: vecNow.Add(time.Duration(off) * time.Second), RequireV1: true}
				if err := Verify(req, secret, opt); err != nil {
					t.Errorf("Verify at now%+d s: %v", off, err)
				}
			}
			for _, off := range []int64{-301, 301, -100000, 100000} {
				opt := Options{Now: vecNow.Add(time.Duration(off) * time.Second)}
				if err := Verify(req, secret, opt); !errors.Is(err, errTimestampWindow) {
					t.Errorf("Verify at now%+d s = %v, want %v", off, err, errTimestampWindow)
				}
			}
		})
	}

	if got := SignBody(secret, []byte(vec1Body)); got != vec1Legacy {
		t.Errorf("SignBody(vector 1) = %s, want %s", got, vec1Legacy)
	}
	legacy := vec1.request(vec1Legacy)
	if err := Verify(legacy, secret, Options{Now: vecNow}); err != nil {
		t.Errorf("Verify(vector 1 legacy): %v", err)
	}
}

func TestVerifyAccepts(t *testing.T) {
	noTS := vec1
	noTS.ts = ""
	stale := vec1
	stale.ts = "1"
	zeros := vec1
	zeros.ts = "0001700000000"
	nonCanonical := vec2.signed()
	for k, v := range nonCanonical.Header {
		delete(nonCanonical.Header, k)
		nonCanonical.Header[strings.ToLower(k)] = v
	}

	for _, tc := range []struct {
		name string
		req  Request
		opt  Options
	}{
		{"v1 while v1 required", vec1.request(vec1Sig), Options{Now: vecNow, RequireV1: true}},
		{"legacy ignores a missing timestamp", noTS.request(vec1Legacy), Options{Now: vecNow}},
		{"legacy ignores a stale timestamp", stale.request(vec1Legacy), Options{Now: vecNow}},
		// Digits only is the whole rule; the MAC covers the string as sent.
		{"timestamp with leading zeros", zeros.signed(), Options{Now: vecNow}},
		{"header keys spelt in lower case", nonCanonical, Options{Now: vecNow}},
		{"empty body legacy", vec3.request(SignBody(secret, nil)), Options{Now: vecNow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Verify(tc.req, secret, tc.opt); err != nil {
				t.Fatalf("Verify: %v", err)
			}
		})
	}
}

func TestVerifyRefuses(t *testing.T) {
	now := Options{Now: vecNow}
	v1Hex := strings.TrimPrefix(vec1Sig, wire.SignaturePrefixV1)
	legacyHex := strings.TrimPrefix(vec1Legacy, wire.SignaturePrefixLegacy)

	with := func(f fields, edit func(*fields)) fields {
		edit(&f)
		return f
	}
	// withHeader signs the request with value as the header's first
	// occurrence, then applies the raw header values.
	withHeader := func(name string, values ...string) Request {
		f := vec1
		switch name {
		case wire.HeaderTimestamp:
			f.ts = values[0]
		case wire.HeaderDispatchID:
			f.did = values[0]
		case wire.HeaderDispatchAttempt:
			f.att = values[0]
		}
		r := f.signed()
		r.Header[name] = values
		return r
	}
	// wrapped = 1700000000 + 2^64: a parser that wrapped around would read
	// it as the current time.
	wrapped := new(big.Int).Lsh(big.NewInt(1), 64)
	wrapped.Add(wrapped, big.NewInt(1700000000))
	wrapped25 := new(big.Int).Mul(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(100000))
	wrapped25.Add(wrapped25, big.NewInt(1700000000))
	if n := len(wrapped25.String()); n != 25 {
		t.Fatalf("wrapped25 has %d digits", n)
	}

	type tc struct {
		name string
		req  Request
		opt  Options
		want error
	}
	cases := []tc{
		{"missing signature", vec1.request(""), now, errSignatureMissing},
		{"signature with no values", func() Request {
			r := vec1.request("")
			r.Header[wire.HeaderSignature] = []string{}
			return r
		}(), now, errSignatureMissing},
		{"repeated signature, both valid", func() Request {
			r := vec1.request(vec1Sig)
			r.Header.Add(wire.HeaderSignature, vec1Sig)
			return r
		}(), now, errSignatureRepeated},
		{"repeated signature, v1 and legacy", func() Request {
			r := vec1.request(vec1Sig)
			r.Header.Add(wire.HeaderSignature, vec1Legacy)
			return r
		}(), now, errSignatureRepeated},
		{"repeated signature under another key spelling", func() Request {
			r := vec1.request(vec1Sig)
			r.Header["rebuno-signature"] = []string{vec1Sig}
			return r
		}(), now, errSignatureRepeated},
		{"empty signature", func() Request {
			r := vec1.request("")
			r.Header[wire.HeaderSignature] = []string{""}
			return r
		}(), now, errSignatureMalformed},
		{"no prefix", vec1.request(v1Hex), now, errSignatureMalformed},
		{"uppercase v1 prefix", vec1.request("V1=" + v1Hex), now, errSignatureMalformed},
		{"uppercase legacy prefix", vec1.request("SHA256=" + legacyHex), now, errSignatureMalformed},
		{"v2 prefix", vec1.request("v2=" + v1Hex), now, errSignatureMalformed},
		{"sha1 prefix", vec1.request("sha1=" + legacyHex), now, errSignatureMalformed},
		{"colon instead of equals", vec1.request("v1:" + v1Hex), now, errSignatureMalformed},
		{"space after prefix", vec1.request("v1= " + v1Hex), now, errSignatureMalformed},
		{"trailing space", vec1.request(vec1Sig + " "), now, errSignatureMalformed},
		{"two values in one header", vec1.request(vec1Sig + "," + vec1Sig), now, errSignatureMalformed},
		{"uppercase hex v1", vec1.request("v1=" + strings.ToUpper(v1Hex)), now, errSignatureMalformed},
		{"uppercase hex legacy", vec1.request("sha256=" + strings.ToUpper(legacyHex)), now, errSignatureMalformed},
		{"one uppercase digit", vec1.request("v1=" + strings.Replace(v1Hex, "f", "F", 1)), now, errSignatureMalformed},
		{"non-hex digit", vec1.request("v1=" + v1Hex[:63] + "g"), now, errSignatureMalformed},
		{"63 hex digits", vec1.request(vec1Sig[:len(vec1Sig)-1]), now, errSignatureMalformed},
		{"65 hex digits", vec1.request(vec1Sig + "0"), now, errSignatureMalformed},
		{"empty v1 MAC", vec1.request("v1="), now, errSignatureMalformed},
		{"legacy 63 hex digits", vec1.request(vec1Legacy[:len(vec1Legacy)-1]), now, errSignatureMalformed},
		{"legacy 65 hex digits", vec1.request(vec1Legacy + "0"), now, errSignatureMalformed},
		{"legacy MAC with v1 prefix", vec1.request("v1=" + legacyHex), now, errMismatch},
		{"v1 MAC with legacy prefix", vec1.request("sha256=" + v1Hex), now, errMismatch},

		{"wrong secret", vec1.request(SignV1([]byte("other-secret"), vec1.method, vec1.target, vec1.ts, vec1.did, vec1.att, vec1.body)), now, errMismatch},
		{"body tampered by one byte", func() Request {
			r := vec1.request(vec1Sig)
			r.Body = []byte(strings.Replace(vec1Body, "ops@", "opz@", 1))
			return r
		}(), now, errMismatch},
		{"body extended by one byte", func() Request {
			r := vec1.request(vec1Sig)
			r.Body = []byte(vec1Body + " ")
			return r
		}(), now, errMismatch},
		{"legacy body tampered by one byte", func() Request {
			r := vec1.request(vec1Legacy)
			r.Body = []byte(strings.Replace(vec1Body, "ops@", "opz@", 1))
			return r
		}(), now, errMismatch},
		{"query changed", with(vec2, func(f *fields) { f.target = execPath + "/steps?status=running" }).request(vec2Sig), now, errMismatch},
		{"query dropped", with(vec2, func(f *fields) { f.target = execPath + "/steps" }).request(vec2Sig), now, errMismatch},
		{"query re-encoded", with(vec2, func(f *fields) { f.target = execPath + "/steps?status=%74erminal" }).request(vec2Sig), now, errMismatch},
		{"path changed", with(vec3, func(f *fields) { f.target = execPath + "/complete" }).request(vec3Sig), now, errMismatch},
		{"method changed", with(vec1, func(f *fields) { f.method = "PUT" }).request(vec1Sig), now, errMismatch},
		{"dispatch id removed", with(vec1, func(f *fields) { f.did = "" }).request(vec1Sig), now, errMismatch},
		{"attempt changed", with(vec1, func(f *fields) { f.att = "4" }).request(vec1Sig), now, errMismatch},
		{"attempt added", with(vec3, func(f *fields) { f.att = "1" }).request(vec3Sig), now, errMismatch},
		{"timestamp changed inside the window", with(vec1, func(f *fields) { f.ts = "1700000001" }).request(vec1Sig), now, errMismatch},

		{"v1 without timestamp", with(vec1, func(f *fields) { f.ts = "" }).signed(), now, errTimestampMissing},
		{"repeated timestamp, same value", withHeader(wire.HeaderTimestamp, vecTS, vecTS), now, errHeaderRepeated},
		{"repeated timestamp under legacy", func() Request {
			r := vec1.request(vec1Legacy)
			r.Header.Add(wire.HeaderTimestamp, vecTS)
			return r
		}(), now, errHeaderRepeated},
		{"out of window, past", vec1.signed(), Options{Now: vecNow.Add(301 * time.Second)}, errTimestampWindow},
		{"out of window, future", vec1.signed(), Options{Now: vecNow.Add(-301 * time.Second)}, errTimestampWindow},
		{"zero Now", vec1.signed(), Options{}, errTimestampWindow},
		{"wraps to now past 2^64", withHeader(wire.HeaderTimestamp, wrapped.String()), now, errTimestampMalformed},
		{"25 digits", withHeader(wire.HeaderTimestamp, wrapped25.String()), now, errTimestampMalformed},
		{"max int64 with zero Now", withHeader(wire.HeaderTimestamp, "9223372036854775807"), Options{}, errTimestampWindow},

		{"legacy while v1 required", vec1.request(vec1Legacy), Options{Now: vecNow, RequireV1: true}, errLegacyRefused},
		{"empty secret", vec1.signed(), now, errSecretEmpty},
	}
	for _, ts := range []string{
		"+1700000000", "-1700000000", " 1700000000", "1700000000 ", "1700000000.0",
		"1.7e9", "0x6553f100", "1_700_000_000", "１７００００００００", "1700000000\x00", "",
	} {
		r := withHeader(wire.HeaderTimestamp, ts)
		cases = append(cases, tc{"timestamp " + ts, r, now, errTimestampMalformed})
	}
	for _, name := range []string{wire.HeaderTimestamp, wire.HeaderDispatchID, wire.HeaderDispatchAttempt} {
		cases = append(cases,
			tc{"CR in " + name, withHeader(name, "1700000000\r"), now, errHeaderCRLF},
			tc{"LF in " + name, withHeader(name, "17000\n00000"), now, errHeaderCRLF},
			tc{"CRLF in " + name, withHeader(name, "\r\n1700000000"), now, errHeaderCRLF},
		)
		if name != wire.HeaderTimestamp {
			cases = append(cases, tc{"repeated " + name, withHeader(name, "3", "3"), now, errHeaderRepeated})
		}
		legacyCRLF := vec1.request(vec1Legacy)
		legacyCRLF.Header[name] = []string{"1\n"}
		cases = append(cases, tc{"CR or LF in " + name + " under legacy", legacyCRLF, now, errHeaderCRLF})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := secret
			if c.want == errSecretEmpty {
				key = nil
			}
			err := Verify(c.req, key, c.opt)
			if !errors.Is(err, c.want) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
		})
	}
}

func TestBearerOK(t *testing.T) {
	const token = "s3cret-Token"
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"Bearer s3cret-Token", true},
		{"bearer s3cret-Token", true},
		{"BEARER s3cret-Token", true},
		{"bEaReR s3cret-Token", true},
		{"Bearer wrong", false},
		{"Bearer s3cret-token", false},
		{"Bearer S3CRET-TOKEN", false},
		{"Bearer s3cret-Toke", false},
		{"Bearer s3cret-Tokenn", false},
		{"Bearer s3cret-Token ", false},
		{"Bearer  s3cret-Token", false},
		{"Bearer\ts3cret-Token", false},
		{"Bearers3cret-Token", false},
		{"s3cret-Token", false},
		{" s3cret-Token", false},
		{"Basic s3cret-Token", false},
		{"Bearer", false},
		{"Bearer ", false},
		{"", false},
	} {
		if got := BearerOK(tc.header, token); got != tc.want {
			t.Errorf("BearerOK(%q) = %v, want %v", tc.header, got, tc.want)
		}
	}
	if BearerOK("Bearer ", "") {
		t.Error("an empty configured token matched")
	}
}

func TestSignBodyIsNeverV1(t *testing.T) {
	// A webhook signature must not pass as a v1 request signature (docs/protocol/auth.md §6).
	r := vec3.request(SignBody(secret, nil))
	if err := Verify(r, secret, Options{Now: vecNow, RequireV1: true}); !errors.Is(err, errLegacyRefused) {
		t.Fatalf("Verify = %v, want %v", err, errLegacyRefused)
	}
}

func TestHeaderValuesLeavesCallerHeaderAlone(t *testing.T) {
	// Spare capacity on both keys: whichever the map yields first, appending
	// to it in place would show up in the caller's header.
	a, b := make([]string, 1, 4), make([]string, 1, 4)
	a[0], b[0] = "a", "b"
	h := http.Header{"Rebuno-Signature": a, "rebuno-signature": b}
	if got := headerValues(h, wire.HeaderSignature); len(got) != 2 {
		t.Fatalf("headerValues = %q, want two values", got)
	}
	if a[:2][1] != "" || b[:2][1] != "" {
		t.Fatalf("caller's slices were written: %q %q", a[:2], b[:2])
	}
}

// The occurrence signature vectors of docs/protocol/vectors/signatures.json.
func TestOccurrenceSignatureVectors(t *testing.T) {
	vs := testvectors.LoadSignatures().Occurrences
	if len(vs) == 0 {
		t.Fatal("no occurrence vectors")
	}
	for _, v := range vs {
		if got := string(OccurrenceMessage(v.RequestSignature, v.Occurrence)); got != v.Message {
			t.Errorf("OccurrenceMessage(occurrence %s) = %q, want %q", v.Occurrence, got, v.Message)
		}
		if got := SignOccurrence([]byte(v.Secret), v.RequestSignature, v.Occurrence); got != v.Signature {
			t.Errorf("SignOccurrence(occurrence %s) = %s, want %s", v.Occurrence, got, v.Signature)
		}
	}
}

// A submit naming its occurrence must bind it with the occurrence signature;
// a captured request replayed with another occurrence, or with the binding
// taken away, is refused as unauthentic.
func TestOccurrenceBinding(t *testing.T) {
	req := vec1.request(vec1Sig)
	opt := Options{Now: vecNow}
	if err := Verify(req, secret, opt); err != nil {
		t.Fatalf("without an occurrence: %v", err)
	}
	req.Header[wire.HeaderStepOccurrence] = []string{"2"}
	if err := Verify(req, secret, opt); !errors.Is(err, errOccurrenceUnbound) {
		t.Fatalf("unbound occurrence: got %v, want %v", err, errOccurrenceUnbound)
	}
	req.Header[wire.HeaderOccurrenceSignature] = []string{SignOccurrence(secret, vec1Sig, "2")}
	if err := Verify(req, secret, opt); err != nil {
		t.Fatalf("bound occurrence: %v", err)
	}
	for name, mutate := range map[string]func(h http.Header){
		"another occurrence": func(h http.Header) { h[wire.HeaderStepOccurrence] = []string{"3"} },
		"signed with another key": func(h http.Header) {
			h[wire.HeaderOccurrenceSignature] = []string{SignOccurrence([]byte("other"), vec1Sig, "2")}
		},
		"bound to another request": func(h http.Header) {
			h[wire.HeaderOccurrenceSignature] = []string{SignOccurrence(secret, vec2Sig, "2")}
		},
		"uppercase hex": func(h http.Header) {
			h[wire.HeaderOccurrenceSignature] = []string{strings.ToUpper(SignOccurrence(secret, vec1Sig, "2"))}
		},
		"repeated occurrence": func(h http.Header) { h[wire.HeaderStepOccurrence] = []string{"2", "2"} },
		"repeated binding": func(h http.Header) {
			s := SignOccurrence(secret, vec1Sig, "2")
			h[wire.HeaderOccurrenceSignature] = []string{s, s}
		},
	} {
		r := vec1.request(vec1Sig)
		r.Header[wire.HeaderStepOccurrence] = []string{"2"}
		r.Header[wire.HeaderOccurrenceSignature] = []string{SignOccurrence(secret, vec1Sig, "2")}
		mutate(r.Header)
		if err := Verify(r, secret, opt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
