package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// Console sessions (docs/protocol/auth.md §2.2): the web console signs in by
// sending an API key once, in the Authorization header of POST /v0/session,
// and gets back a cookie holding a session token of its own. The key is never
// put in the cookie, in browser storage or in a URL.

// sessionCookiePath limits the cookie to the API: the console's own files
// need no credentials.
const sessionCookiePath = "/v0"

func handleSignIn(c *call) error {
	vals := c.r.Header.Values(wire.HeaderAuthorization)
	token, ok := "", len(vals) == 1
	if ok {
		token, ok = bearerToken(vals[0])
	}
	if !ok {
		return &kernel.Error{Code: wire.CodeUnauthorized, Message: "unauthorized: sign in with an API key in the Authorization header"}
	}
	if !auth.LooksLikeAPIKey(token) {
		return invalid(wire.HeaderAuthorization, "only an API key can sign in (the bootstrap token cannot); create one with `rebuno keys create`")
	}
	p, err := c.s.k.AuthenticateKey(c.ctx(), token)
	if err != nil {
		return err
	}
	session, expires, err := c.s.k.CreateSession(c.ctx(), p)
	if err != nil {
		return err
	}
	c.setSessionCookie(session, expires)
	c.writeJSON(http.StatusOK, (&jsonx.Object{}).String("name", p.Name).String("role", p.Role).
		String("expires_at", wire.FormatTime(expires)).Bytes())
	return nil
}

// handleSignOut ends the session the cookie names, if any, and clears the
// cookie; signing out twice is no error.
func handleSignOut(c *call) error {
	if cookie, err := c.r.Cookie(SessionCookie); err == nil && cookie.Value != "" {
		if err := c.s.k.EndSession(c.ctx(), cookie.Value); err != nil {
			return err
		}
	}
	c.setSessionCookie("", time.Time{})
	c.noContent()
	return nil
}

// setSessionCookie sets the session cookie, or clears it when value is "".
func (c *call) setSessionCookie(value string, expires time.Time) {
	cookie := &http.Cookie{Name: SessionCookie, Value: value, Path: sessionCookiePath, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: overTLS(c.r)}
	if value == "" {
		cookie.MaxAge = -1
	} else {
		cookie.Expires = expires
		cookie.MaxAge = int(expires.Sub(c.s.k.Clock().Now()).Seconds())
	}
	http.SetCookie(c.w, cookie)
}

// overTLS reports whether the browser reached the kernel over HTTPS: the
// connection itself, or the proxy in front of it that says so.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}
