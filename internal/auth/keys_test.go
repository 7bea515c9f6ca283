package auth

import (
	"errors"
	"strings"
	"testing"
)

func TestAPIKeys(t *testing.T) {
	dep, err := NewDeploymentID()
	if err != nil || len(dep) != deploymentLen {
		t.Fatalf("deployment %q (%v)", dep, err)
	}
	key, err := NewAPIKey(dep)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseAPIKey(key); err != nil || got != dep {
		t.Fatalf("ParseAPIKey(%s) = %q, %v; want %q", key, got, err, dep)
	}
	other, _ := NewAPIKey(dep)
	if other == key || KeyHash(other) == KeyHash(key) || len(KeyHash(key)) != 64 {
		t.Fatal("two keys collide")
	}
	flip := func(s string, i int) string {
		c := byte('a')
		if s[i] == 'a' {
			c = 'b'
		}
		return s[:i] + string(c) + s[i+1:]
	}
	for name, bad := range map[string]string{
		"truncated":            key[:len(key)-1],
		"one character off":    flip(key, len(key)-20),
		"checksum off":         flip(key, len(key)-1),
		"uppercase":            strings.ToUpper(key),
		"extended":             key + "a",
		"not a key":            "rbk_hello",
		"deployment separator": key[:len(keyPrefix)+deploymentLen] + "a" + key[len(keyPrefix)+deploymentLen+1:],
	} {
		if _, err := ParseAPIKey(bad); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("%s: ParseAPIKey = %v, want ErrMalformedKey", name, err)
		}
	}
}
