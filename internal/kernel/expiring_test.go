package kernel

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

func TestExpiring(t *testing.T) {
	var c expiring[string]
	now := time.Unix(1000, 0)
	loads := 0
	load := func(v string) func() (string, error) {
		return func() (string, error) { loads++; return v, nil }
	}
	if v, _ := c.get("a", now, time.Second, load("one")); v != "one" || loads != 1 {
		t.Fatalf("first get = %q after %d loads", v, loads)
	}
	if v, _ := c.get("a", now.Add(999*time.Millisecond), time.Second, load("two")); v != "one" || loads != 1 {
		t.Fatalf("within the TTL: %q after %d loads, want the remembered value", v, loads)
	}
	if v, _ := c.get("a", now.Add(time.Second), time.Second, load("two")); v != "two" || loads != 2 {
		t.Fatalf("at the TTL: %q after %d loads, want a fresh load", v, loads)
	}
	c.forget("a")
	if v, _ := c.get("a", now.Add(time.Second), time.Second, load("three")); v != "three" {
		t.Fatalf("after forget: %q", v)
	}
	// A failed load is not remembered.
	boom := errors.New("boom")
	if _, err := c.get("b", now, time.Second, func() (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Fatalf("failed load: %v", err)
	}
	if v, _ := c.get("b", now, time.Second, load("fine")); v != "fine" {
		t.Fatalf("after a failed load: %q", v)
	}
	// Bounded: full, it starts over.
	for i := 0; i < expiringCap; i++ {
		c.get(fmt.Sprint("k", i), now, time.Hour, load("x"))
	}
	c.mu.Lock()
	n := len(c.m)
	c.mu.Unlock()
	if n > expiringCap {
		t.Fatalf("%d entries, more than %d", n, expiringCap)
	}
}

// A secret changed on this kernel applies to the next signed request at
// once; an unknown agent is not remembered.
func TestAgentSecretFollowsRegistration(t *testing.T) {
	fx := newFixture(t)
	if _, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/", Secret: "first-secret"}); err != nil {
		t.Fatal(err)
	}
	if s, err := fx.k.AgentSecret(fx.ctx, "a1"); err != nil || s != "first-secret" {
		t.Fatalf("AgentSecret = %q, %v", s, err)
	}
	if _, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/", Secret: "rotated-secret"}); err != nil {
		t.Fatal(err)
	}
	if s, _ := fx.k.AgentSecret(fx.ctx, "a1"); s != "rotated-secret" {
		t.Fatalf("after rotation AgentSecret = %q", s)
	}
	if _, err := fx.k.AgentSecret(fx.ctx, "ghost"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown agent: %v", err)
	}
	if _, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "ghost", WebhookURL: "http://h/", Secret: "now-it-exists"}); err != nil {
		t.Fatal(err)
	}
	if s, _ := fx.k.AgentSecret(fx.ctx, "ghost"); s != "now-it-exists" {
		t.Fatalf("a failed lookup was remembered: %q", s)
	}
}
