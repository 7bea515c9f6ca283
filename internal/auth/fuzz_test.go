package auth

import (
	"bytes"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/wire"
)

// FuzzVerify feeds Verify arbitrary signatures and timestamps, and checks
// that requests signed by SignV1 round-trip and stop verifying when their body
// changes. Seeds live in testdata/fuzz/FuzzVerify.
func FuzzVerify(f *testing.F) {
	f.Fuzz(func(t *testing.T, method, target string, body []byte, sig, ts string, pos uint, mask byte) {
		// Arbitrary header values: Verify must not panic, and whatever it
		// accepts must be exactly the signature that SignV1 or SignBody would
		// have produced, in the one spelling the protocol allows.
		raw := Request{
			Method: method,
			Target: target,
			Header: http.Header{wire.HeaderSignature: {sig}, wire.HeaderTimestamp: {ts}},
			Body:   body,
		}
		if err := Verify(raw, secret, Options{Now: vecNow}); err == nil &&
			sig != SignV1(secret, method, target, ts, "", "", body) && sig != SignBody(secret, body) {
			t.Fatalf("accepted a signature no signer produces: %q", sig)
		}
		if err := Verify(raw, secret, Options{Now: vecNow, RequireV1: true}); err == nil &&
			sig != SignV1(secret, method, target, ts, "", "", body) {
			t.Fatalf("accepted a non-v1 signature while v1 is required: %q", sig)
		}

		own := bytes.Clone(body)
		req := Request{
			Method: method,
			Target: target,
			Header: http.Header{
				wire.HeaderSignature:       {SignV1(secret, method, target, vecTS, vecDID, "1", own)},
				wire.HeaderTimestamp:       {vecTS},
				wire.HeaderDispatchID:      {vecDID},
				wire.HeaderDispatchAttempt: {"1"},
			},
			Body: own,
		}
		opt := Options{Now: vecNow.Add(time.Duration(int64(pos%601)-300) * time.Second), RequireV1: true}
		if err := Verify(req, secret, opt); err != nil {
			t.Fatalf("signed request refused: %v", err)
		}

		if mask == 0 {
			mask = 1
		}
		if len(own) > 0 {
			i := int(pos % uint(len(own)))
			own[i] ^= mask
			if err := Verify(req, secret, opt); !errors.Is(err, errMismatch) {
				t.Fatalf("body byte %d xor %#x: Verify = %v, want %v", i, mask, err, errMismatch)
			}
			own[i] ^= mask
		}
		req.Body = append(own, mask)
		if err := Verify(req, secret, opt); !errors.Is(err, errMismatch) {
			t.Fatalf("body extended by one byte: Verify = %v, want %v", err, errMismatch)
		}
	})
}

func BenchmarkVerifyV1(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 200)
	target := execPath + "/steps"
	req := Request{
		Method: "POST",
		Target: target,
		Header: http.Header{
			wire.HeaderSignature:       {SignV1(secret, "POST", target, vecTS, vecDID, "3", body)},
			wire.HeaderTimestamp:       {vecTS},
			wire.HeaderDispatchID:      {vecDID},
			wire.HeaderDispatchAttempt: {"3"},
			wire.HeaderAgentID:         {"agent-1"},
			"Content-Type":             {"application/json"},
			"User-Agent":               {"rebuno-sdk-go"},
		},
		Body: body,
	}
	opt := Options{Now: vecNow, RequireV1: true}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := Verify(req, secret, opt); err != nil {
			b.Fatal(err)
		}
	}
}
