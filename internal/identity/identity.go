// Package identity computes the args hash and the step id (docs/protocol/identity.md). Both are
// recorded with every step and compared on replay, and they must be
// bit-exact with the public Rebuno kernel, so nothing here may change.
package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/rebuno/rebuno/internal/jsonx"
)

// maxDepth is the nesting limit of docs/protocol/http.md §5, applied when raw args are parsed
// here so that a hash is only ever produced for args a request could carry.
const maxDepth = 128

// ArgsHash returns the lowercase hex SHA-256 of the canonical JSON of args.
// A nil args (absent) hashes like JSON null, as docs/protocol/identity.md §2 rule 1 requires.
func ArgsHash(args *jsonx.Value) string {
	// Small args are canonicalised on the stack; large ones spill to the heap.
	var buf [512]byte
	sum := sha256.Sum256(jsonx.AppendCanonical(buf[:0], args))
	return hex.EncodeToString(sum[:])
}

// ArgsHashBytes parses raw args strictly (as a request body is) and hashes
// them. Empty raw means absent args and hashes like null.
func ArgsHashBytes(raw []byte) (string, error) {
	if len(raw) == 0 {
		return ArgsHash(nil), nil
	}
	v, err := jsonx.Parse(raw, maxDepth)
	if err != nil {
		return "", err
	}
	return ArgsHash(v), nil
}

// StepID returns the step id of docs/protocol/identity.md §4. The fields are length-prefixed so
// that no choice of target or kind can make two different field tuples
// produce the same preimage.
func StepID(executionID, kind, target, argsHash string, occurrence int64) string {
	var buf [256]byte
	sum := sha256.Sum256(appendPreimage(buf[:0], executionID, kind, target, argsHash, occurrence))
	return hex.EncodeToString(sum[:])
}

func appendPreimage(dst []byte, executionID, kind, target, argsHash string, occurrence int64) []byte {
	var occ [20]byte
	for _, f := range [...]string{executionID, kind, target, argsHash, string(strconv.AppendInt(occ[:0], occurrence, 10))} {
		dst = strconv.AppendInt(dst, int64(len(f)), 10)
		dst = append(dst, ':')
		dst = append(dst, f...)
	}
	return dst
}
