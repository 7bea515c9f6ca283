package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"strings"
)

// API keys are bearer tokens the kernel issues to people and programs, each
// with a name and a role. A key reads
//
//	rbk_<deployment>_<secret><checksum>
//
// where deployment names the kernel's database (so a key pasted into the
// wrong deployment is recognised as such, not just as unknown), secret is 32
// random bytes and checksum is a CRC-32 of everything before it, so that a
// truncated or mistyped key is refused without a lookup. The kernel stores
// only KeyHash of a key.

const (
	keyPrefix        = "rbk_"
	deploymentLen    = 16 // base32 characters (10 random bytes)
	keySecretLen     = 52 // base32 characters (32 random bytes)
	keyChecksumLen   = 7  // base32 characters (4 bytes of CRC-32)
	apiKeyLen        = len(keyPrefix) + deploymentLen + 1 + keySecretLen + keyChecksumLen
	deploymentSource = 10
)

var keyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// ErrMalformedKey is a bearer token shaped like an API key that is not one:
// truncated, mistyped or made up.
var ErrMalformedKey = errors.New("malformed API key")

// NewDeploymentID returns a fresh identifier for a deployment's keys.
func NewDeploymentID() (string, error) {
	b := make([]byte, deploymentSource)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return strings.ToLower(keyEncoding.EncodeToString(b)), nil
}

// NewAPIKey returns a new key of the deployment.
func NewAPIKey(deployment string) (string, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", err
	}
	body := keyPrefix + deployment + "_" + strings.ToLower(keyEncoding.EncodeToString(secret))
	return body + checksum(body), nil
}

func checksum(body string) string {
	var b [4]byte
	c := crc32.ChecksumIEEE([]byte(body))
	b[0], b[1], b[2], b[3] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
	return strings.ToLower(keyEncoding.EncodeToString(b[:]))
}

// LooksLikeAPIKey reports whether a bearer token claims to be an API key.
func LooksLikeAPIKey(token string) bool { return strings.HasPrefix(token, keyPrefix) }

// ParseAPIKey checks a key's shape and checksum and returns the deployment
// it belongs to.
func ParseAPIKey(token string) (deployment string, err error) {
	if len(token) != apiKeyLen || !strings.HasPrefix(token, keyPrefix) || token[len(keyPrefix)+deploymentLen] != '_' {
		return "", ErrMalformedKey
	}
	for _, c := range token[len(keyPrefix):] {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7' || c == '_') {
			return "", ErrMalformedKey
		}
	}
	body := token[:len(token)-keyChecksumLen]
	if checksum(body) != token[len(body):] {
		return "", ErrMalformedKey
	}
	return token[len(keyPrefix) : len(keyPrefix)+deploymentLen], nil
}

// KeyHash is what the kernel stores of a key (and of a session token): the
// hex SHA-256 of it. The tokens carry 256 random bits, so a plain hash is as
// hard to invert as the token is to guess.
func KeyHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}
