package kernel

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Access: who a bearer caller is and what it may do. The bootstrap token
// (--bearer-token) and a kernel with auth off act as administrators without a
// name; scoped API keys carry a name and a role, and the name is the caller's
// identity wherever one is recorded (an approval's decider, the audit log).

// Principal is an authenticated bearer caller.
type Principal struct {
	Name string // the key's name; "" for the bootstrap token and auth off
	Role string
	// Key is true when a scoped API key authenticated the caller: its name
	// is then an identity the kernel vouches for.
	Key bool
}

// Admin is the principal of the bootstrap token and of a kernel without auth.
var Admin = Principal{Role: wire.RoleAdmin}

// Actor is how the audit log names a principal.
func (p Principal) Actor() string {
	if p.Key {
		return p.Name
	}
	return "bootstrap"
}

// Audit actions.
const (
	AuditKeyCreated      = "key.created"
	AuditKeyRevoked      = "key.revoked"
	AuditApprovalGranted = "approval.granted"
	AuditApprovalDenied  = "approval.denied"
)

// keyName is the syntax of a key's name: the agent id syntax.
var keyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Limits of keys and sessions.
const (
	maxKeyLifetime  = 10 * 365 * 24 * time.Hour
	sessionLifetime = 12 * time.Hour
	// keyCacheTTL bounds how long a revoked or expired key keeps working on
	// a process that checked it just before (every process, docs/protocol/README.md-wide:
	// within 2 s).
	keyCacheTTL = time.Second
	// touchEvery is how often a key's last use is written at most.
	touchEvery        = time.Minute
	settingDeployment = "deployment"
)

// CreateKeyRequest asks for a new API key.
type CreateKeyRequest struct {
	Name      string
	Role      string
	ExpiresIn time.Duration // 0: never
}

// CreateAPIKey makes a key and returns its token, which is shown this once:
// only its hash is kept.
func (k *Kernel) CreateAPIKey(ctx context.Context, by Principal, r CreateKeyRequest) (*store.APIKey, string, error) {
	switch {
	case !keyName.MatchString(r.Name):
		return nil, "", validation("name", "name must match %s", keyName)
	case !wire.ValidRole(r.Role):
		return nil, "", validation("role", "unknown role %q (one of %v)", r.Role, wire.Roles)
	case r.ExpiresIn < 0 || r.ExpiresIn > maxKeyLifetime:
		return nil, "", validation("expires_in", "a key lives between a second and ten years, or forever (0)")
	}
	deployment, err := k.deployment(ctx)
	if err != nil {
		return nil, "", err
	}
	token, err := auth.NewAPIKey(deployment)
	if err != nil {
		return nil, "", fmt.Errorf("new key: %w", err)
	}
	now := k.clock.Now().Truncate(time.Microsecond)
	key := &store.APIKey{Name: r.Name, Role: r.Role, Hash: auth.KeyHash(token), CreatedAt: now, CreatedBy: by.Actor()}
	if r.ExpiresIn > 0 {
		key.ExpiresAt = now.Add(r.ExpiresIn)
	}
	err = k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertAPIKey(ctx, key); err != nil {
			if errors.Is(err, store.ErrExists) {
				return errConflict(fmt.Sprintf("a key named %q exists (names are never reused, revoked keys included)", r.Name))
			}
			return fmt.Errorf("insert key: %w", err)
		}
		detail := (&jsonx.Object{}).String("role", r.Role)
		if !key.ExpiresAt.IsZero() {
			detail.String("expires_at", wire.FormatTime(key.ExpiresAt))
		}
		return tx.AppendAudit(ctx, &store.AuditEntry{At: now, Actor: by.Actor(), Action: AuditKeyCreated, Subject: r.Name, Detail: detail.Bytes()})
	})
	if err != nil {
		return nil, "", err
	}
	return key, token, nil
}

// ListAPIKeys lists every key by name, revoked ones included.
func (k *Kernel) ListAPIKeys(ctx context.Context) ([]*store.APIKey, error) {
	return k.store.Read().ListAPIKeys(ctx)
}

// RevokeAPIKey ends a key at once on this process and within keyCacheTTL on
// every other one; its console sessions end with it.
func (k *Kernel) RevokeAPIKey(ctx context.Context, by Principal, name string) error {
	now := k.clock.Now().Truncate(time.Microsecond)
	err := k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		key, err := tx.APIKey(ctx, name)
		if err != nil {
			return notFoundOr(err, "key")
		}
		if !key.RevokedAt.IsZero() {
			return errConflict(fmt.Sprintf("key %q is already revoked", name))
		}
		key.RevokedAt = now
		if err := tx.UpdateAPIKey(ctx, key); err != nil {
			return fmt.Errorf("revoke key: %w", err)
		}
		return tx.AppendAudit(ctx, &store.AuditEntry{At: now, Actor: by.Actor(), Action: AuditKeyRevoked, Subject: name})
	})
	if err == nil {
		k.keys.byHash.forgetAll()
	}
	return err
}

// AuditLog reads the access audit log after a seq, oldest first.
func (k *Kernel) AuditLog(ctx context.Context, afterSeq int64, limit int) ([]*store.AuditEntry, error) {
	switch {
	case afterSeq < 0:
		return nil, validation("after", "after must not be negative")
	case limit < 0:
		return nil, validation("limit", "limit must not be negative")
	case limit == 0, limit > wire.MaxEventsLimit:
		limit = wire.MaxEventsLimit
	}
	return k.store.Read().AuditLog(ctx, afterSeq, limit)
}

// errKey answers a bearer token that is no valid key, saying why: a key
// carries no secret worth hiding once it is refused.
func errKey(why string) *Error {
	return &Error{Code: wire.CodeUnauthorized, Message: "unauthorized: " + why}
}

// AuthenticateKey finds the principal of an API key.
func (k *Kernel) AuthenticateKey(ctx context.Context, token string) (Principal, error) {
	deployment, err := auth.ParseAPIKey(token)
	if err != nil {
		return Principal{}, errKey("malformed API key (truncated or mistyped?)")
	}
	ours, err := k.deployment(ctx)
	if err != nil {
		return Principal{}, err
	}
	if deployment != ours {
		return Principal{}, errKey("this API key was issued by another deployment")
	}
	key, err := k.keys.get(ctx, k, auth.KeyHash(token))
	if err != nil {
		return Principal{}, err
	}
	return k.principalOf(ctx, key)
}

// principalOf checks that a key is still valid now and names its principal.
func (k *Kernel) principalOf(ctx context.Context, key *store.APIKey) (Principal, error) {
	now := k.clock.Now()
	switch {
	case key == nil:
		return Principal{}, errKey("unknown API key")
	case !key.RevokedAt.IsZero():
		return Principal{}, errKey(fmt.Sprintf("API key %q was revoked", key.Name))
	case !key.ExpiresAt.IsZero() && !now.Before(key.ExpiresAt):
		return Principal{}, errKey(fmt.Sprintf("API key %q expired", key.Name))
	}
	k.keys.touch(ctx, k, key, now)
	return Principal{Name: key.Name, Role: key.Role, Key: true}, nil
}

// deployment is the id this deployment's keys carry, made on first use.
func (k *Kernel) deployment(ctx context.Context) (string, error) {
	if id := k.keys.deploymentID(); id != "" {
		return id, nil
	}
	id, err := k.store.Read().Setting(ctx, settingDeployment)
	if errors.Is(err, store.ErrNotFound) {
		fresh, ferr := auth.NewDeploymentID()
		if ferr != nil {
			return "", ferr
		}
		if uerr := k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
			return tx.InsertSettingIfAbsent(ctx, settingDeployment, fresh)
		}); uerr != nil {
			return "", fmt.Errorf("store the deployment id: %w", uerr)
		}
		// Another process may have won the race: read what was kept.
		id, err = k.store.Read().Setting(ctx, settingDeployment)
	}
	if err != nil {
		return "", fmt.Errorf("read the deployment id: %w", err)
	}
	k.keys.setDeploymentID(id)
	return id, nil
}

// ---- sessions ----

// CreateSession exchanges a key's principal for a console session token,
// valid until it expires or the key stops being valid.
func (k *Kernel) CreateSession(ctx context.Context, p Principal) (string, time.Time, error) {
	if !p.Key {
		return "", time.Time{}, validation("key", "only an API key can sign in")
	}
	deployment, err := k.deployment(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	token, err := auth.NewAPIKey(deployment) // the same randomness and shape
	if err != nil {
		return "", time.Time{}, err
	}
	now := k.clock.Now().Truncate(time.Microsecond)
	s := &store.Session{Hash: auth.KeyHash(token), KeyName: p.Name, CreatedAt: now, ExpiresAt: now.Add(sessionLifetime)}
	err = k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.DeleteSessionsBefore(ctx, now); err != nil {
			return err
		}
		return tx.InsertSession(ctx, s)
	})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("create session: %w", err)
	}
	return token, s.ExpiresAt, nil
}

// SessionPrincipal finds the principal of a console session token.
func (k *Kernel) SessionPrincipal(ctx context.Context, token string) (Principal, error) {
	s, err := k.store.Read().Session(ctx, auth.KeyHash(token))
	if errors.Is(err, store.ErrNotFound) || (err == nil && !k.clock.Now().Before(s.ExpiresAt)) {
		return Principal{}, errKey("the session has ended; sign in again")
	}
	if err != nil {
		return Principal{}, fmt.Errorf("read session: %w", err)
	}
	key, err := k.store.Read().APIKey(ctx, s.KeyName)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return Principal{}, fmt.Errorf("read key: %w", err)
	}
	return k.principalOf(ctx, key)
}

// EndSession signs a console session out.
func (k *Kernel) EndSession(ctx context.Context, token string) error {
	return k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.DeleteSession(ctx, auth.KeyHash(token))
	})
}

// ---- the key cache ----

// keyCache keeps keys by hash for keyCacheTTL, so that each request of a
// key costs no store read while a revocation still applies within it, and
// throttles the writes of last use.
type keyCache struct {
	byHash  expiring[*store.APIKey] // nil: no such key
	mu      sync.Mutex
	touched map[string]time.Time
	depID   string
}

func (c *keyCache) get(ctx context.Context, k *Kernel, hash string) (*store.APIKey, error) {
	return c.byHash.get(hash, time.Now(), keyCacheTTL, func() (*store.APIKey, error) {
		key, err := k.store.Read().APIKeyByHash(ctx, hash)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read key: %w", err)
		}
		return key, nil
	})
}

func (c *keyCache) deploymentID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.depID
}

func (c *keyCache) setDeploymentID(id string) {
	c.mu.Lock()
	c.depID = id
	c.mu.Unlock()
}

// touch records a key's use, at most once per touchEvery per key and
// process, off the request path: last use is for operators' eyes, not a
// rule, so a lost write costs nothing.
func (c *keyCache) touch(ctx context.Context, k *Kernel, key *store.APIKey, now time.Time) {
	c.mu.Lock()
	if c.touched == nil || len(c.touched) >= 10000 {
		c.touched = map[string]time.Time{}
	}
	if last, ok := c.touched[key.Name]; ok && now.Sub(last) < touchEvery {
		c.mu.Unlock()
		return
	}
	c.touched[key.Name] = now
	c.mu.Unlock()
	name := key.Name
	go func() {
		err := k.store.Update(context.WithoutCancel(ctx), "", func(ctx context.Context, tx store.Tx) error {
			stored, err := tx.APIKey(ctx, name)
			if err != nil {
				return err
			}
			stored.LastUsedAt = now.Truncate(time.Microsecond)
			return tx.UpdateAPIKey(ctx, stored)
		})
		if err != nil {
			k.log.Warn("recording a key's last use failed", "key", name, "error", err)
		}
	}()
}
