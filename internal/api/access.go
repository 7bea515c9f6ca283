package api

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// SessionCookie carries a console session: a token of its own, never the key
// it was exchanged for (the console's sign-in sets it).
const SessionCookie = "rebuno_session"

// authenticateBearer finds who a bearer caller is (docs/protocol/auth.md §2 and the access
// rules): the bootstrap token, a scoped API key, or a console session; with
// auth off, an administrator unless a key says who. Then it checks the
// route's role.
func (c *call) authenticateBearer() error {
	p, err := c.bearerPrincipal()
	if err != nil {
		return err
	}
	if !wire.RoleAllows(p.Role, c.route.role) {
		return &kernel.Error{Code: wire.CodeForbidden,
			Message: fmt.Sprintf("forbidden: the %s role cannot do this; it needs the %s role", p.Role, c.route.role),
			Details: map[string]any{"role": p.Role, "role_needed": c.route.role}}
	}
	c.principal = p
	return nil
}

func (c *call) bearerPrincipal() (kernel.Principal, error) {
	headers := c.r.Header.Values(wire.HeaderAuthorization)
	authOff := c.s.opt.BearerToken == ""
	if len(headers) == 0 {
		if cookie, err := c.r.Cookie(SessionCookie); err == nil && cookie.Value != "" {
			p, err := c.s.k.SessionPrincipal(c.ctx(), cookie.Value)
			if err == nil || !authOff {
				return p, err
			}
		}
		if authOff {
			return kernel.Admin, nil
		}
		c.log().Info("bearer authentication failed: no credentials")
		return kernel.Principal{}, errUnauthorized
	}
	if len(headers) == 1 {
		if !authOff && auth.BearerOK(headers[0], c.s.opt.BearerToken) {
			return kernel.Admin, nil
		}
		if token, ok := bearerToken(headers[0]); ok && auth.LooksLikeAPIKey(token) {
			p, err := c.s.k.AuthenticateKey(c.ctx(), token)
			if err == nil || !authOff {
				if err != nil {
					c.log().Info("API key refused", "cause", err)
				}
				return p, err
			}
		}
	}
	if authOff {
		// Auth off ignores what it cannot use (docs/protocol/auth.md §2).
		return kernel.Admin, nil
	}
	c.log().Info("bearer authentication failed")
	return kernel.Principal{}, errUnauthorized
}

// bearerToken takes the token out of an Authorization value: the scheme word
// in any case and one space.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// ---- routes ----

func handleCreateKey(c *call) error {
	f, err := parseBody(c.body, "name", "role", "expires_in_seconds")
	if err != nil {
		return err
	}
	r := kernel.CreateKeyRequest{Name: f.str("name"), Role: f.str("role")}
	secs, _ := f.integer("expires_in_seconds", 0, 10*365*24*3600)
	if f.err != nil {
		return f.err
	}
	r.ExpiresIn = time.Duration(secs) * time.Second
	key, token, err := c.s.k.CreateAPIKey(c.ctx(), c.principal, r)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusCreated, renderKey(key).String("token", token).Bytes())
	return nil
}

func handleListKeys(c *call) error {
	keys, err := c.s.k.ListAPIKeys(c.ctx())
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderList(keys, renderKey))
	return nil
}

func handleRevokeKey(c *call) error {
	name := c.params["name"]
	if err := c.s.k.RevokeAPIKey(c.ctx(), c.principal, name); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handleAudit(c *call) error {
	after, _, err := c.queryInt("after")
	if err != nil {
		return err
	}
	limit, _, err := c.queryInt("limit")
	if err != nil {
		return err
	}
	entries, err := c.s.k.AuditLog(c.ctx(), after, int(limit))
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderList(entries, func(e *store.AuditEntry) *jsonx.Object {
		return (&jsonx.Object{}).Int("seq", e.Seq).String("at", wire.FormatTime(e.At)).String("actor", e.Actor).
			String("action", e.Action).String("subject", e.Subject).Raw("detail", e.Detail)
	}))
	return nil
}

// handleWhoami says who the credentials are, for the CLI and the console.
func handleWhoami(c *call) error {
	p := c.principal
	o := (&jsonx.Object{}).String("role", p.Role).Bool("key", p.Key)
	if p.Name != "" {
		o.String("name", p.Name)
	}
	o.Bool("auth", c.s.opt.BearerToken != "")
	c.writeJSON(http.StatusOK, o.Bytes())
	return nil
}

func renderKey(k *store.APIKey) *jsonx.Object {
	o := (&jsonx.Object{}).String("name", k.Name).String("role", k.Role).
		String("created_at", wire.FormatTime(k.CreatedAt)).String("created_by", k.CreatedBy)
	for name, t := range map[string]time.Time{"expires_at": k.ExpiresAt, "revoked_at": k.RevokedAt, "last_used_at": k.LastUsedAt} {
		if !t.IsZero() {
			o.String(name, wire.FormatTime(t))
		}
	}
	return o
}
