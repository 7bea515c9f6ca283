package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

// ---- access: API keys, the audit log, sessions, settings ----

var accessScenarios = []scenario{
	{"APIKeys", testAPIKeys},
	{"AuditLog", testAuditLog},
	{"SessionsAndSettings", testSessionsAndSettings},
}

func testAPIKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	k := &store.APIKey{Name: "alice", Role: "approver", Hash: "h-alice", CreatedAt: at(time.Second), CreatedBy: "bootstrap",
		ExpiresAt: at(time.Hour)}
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.InsertAPIKey(ctx, k) })
	same(t, "APIKey", val(s.Read().APIKey(ctx, "alice")).get(t, "APIKey"), k)
	same(t, "APIKeyByHash", val(s.Read().APIKeyByHash(ctx, "h-alice")).get(t, "APIKeyByHash"), k)
	if _, err := s.Read().APIKeyByHash(ctx, "h-nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("APIKeyByHash of an unknown hash: %v", err)
	}
	// A name is taken for good, whatever the other fields.
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertAPIKey(ctx, &store.APIKey{Name: "alice", Role: "viewer", Hash: "h-other", CreatedAt: at(0), CreatedBy: "x"})
	})
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("InsertAPIKey of a taken name: %v, want ErrExists", err)
	}
	if _, err := s.Read().APIKeyByHash(ctx, "h-other"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("the refused key was stored")
	}
	k.RevokedAt, k.LastUsedAt = at(2*time.Second), at(90*time.Second)
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.UpdateAPIKey(ctx, k) })
	bob := &store.APIKey{Name: "bob", Role: "viewer", Hash: "h-bob", CreatedAt: at(0), CreatedBy: "alice"}
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.InsertAPIKey(ctx, bob) })
	keys := val(s.Read().ListAPIKeys(ctx)).get(t, "ListAPIKeys")
	if len(keys) != 2 {
		t.Fatalf("ListAPIKeys: %d keys, want 2", len(keys))
	}
	same(t, "ListAPIKeys[0]", keys[0], k)
	same(t, "ListAPIKeys[1]", keys[1], bob)
}

func testAuditLog(t *testing.T, s store.Store) {
	ctx := t.Context()
	if got := val(s.Read().AuditLog(ctx, 0, 10)).get(t, "AuditLog"); len(got) != 0 {
		t.Fatalf("AuditLog of an empty store: %v", got)
	}
	for i, action := range []string{"key.created", "approval.granted", "key.revoked"} {
		e := &store.AuditEntry{At: at(time.Duration(i) * time.Second), Actor: "alice", Action: action, Subject: "s", Detail: []byte(`{"i":1}`)}
		update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.AppendAudit(ctx, e) })
	}
	all := val(s.Read().AuditLog(ctx, 0, 10)).get(t, "AuditLog")
	if len(all) != 3 || all[0].Action != "key.created" || all[2].Action != "key.revoked" ||
		all[0].Seq >= all[1].Seq || all[1].Seq >= all[2].Seq || string(all[1].Detail) != `{"i":1}` || !all[1].At.Equal(at(time.Second)) {
		t.Fatalf("AuditLog = %+v", all)
	}
	if got := val(s.Read().AuditLog(ctx, all[0].Seq, 1)).get(t, "AuditLog"); len(got) != 1 || got[0].Seq != all[1].Seq {
		t.Fatalf("AuditLog after the first, limit 1 = %+v", got)
	}
}

func testSessionsAndSettings(t *testing.T, s store.Store) {
	ctx := t.Context()
	old := &store.Session{Hash: "s-old", KeyName: "alice", CreatedAt: at(0), ExpiresAt: at(time.Minute)}
	fresh := &store.Session{Hash: "s-new", KeyName: "alice", CreatedAt: at(0), ExpiresAt: at(time.Hour)}
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertSession(ctx, old); err != nil {
			return err
		}
		return tx.InsertSession(ctx, fresh)
	})
	same(t, "Session", val(s.Read().Session(ctx, "s-new")).get(t, "Session"), fresh)
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteSessionsBefore(ctx, at(30*time.Minute)) })
	if _, err := s.Read().Session(ctx, "s-old"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("expired session: %v", err)
	}
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteSession(ctx, "s-new") })
	if _, err := s.Read().Session(ctx, "s-new"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted session: %v", err)
	}

	if _, err := s.Read().Setting(ctx, "deployment"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unset setting: %v", err)
	}
	for _, v := range []string{"first", "second"} {
		update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.InsertSettingIfAbsent(ctx, "deployment", v) })
	}
	if got := val(s.Read().Setting(ctx, "deployment")).get(t, "Setting"); got != "first" {
		t.Fatalf("Setting = %q, want the first value kept", got)
	}
}
