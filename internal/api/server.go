// Package api is the HTTP face of the kernel: each handler parses a request,
// calls one kernel verb and writes JSON. Authentication, the order of checks
// of docs/protocol/http.md §8 and the mapping of errors to statuses live here once.
package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Options configure the HTTP layer.
type Options struct {
	BearerToken  string
	RequireV1    bool
	MaxBodyBytes int64
	MaxStreams   int64
	// MaxWaits bounds the requests held until an execution ends (wait.go).
	MaxWaits int64
	Logger   *slog.Logger
	// ManualClock enables POST /v0/test/clock (test builds only).
	ManualClock *clock.Manual
	// ListenAddr, AllowedHosts and AllowedOrigins drive the checks that keep
	// web pages from driving the kernel (origin.go).
	ListenAddr     string
	AllowedHosts   []string
	AllowedOrigins []string
}

// Server handles the /v0 API.
type Server struct {
	k        *kernel.Kernel
	opt      Options
	log      *slog.Logger
	routes   router
	streams  atomic.Int64
	waits    atomic.Int64
	draining atomic.Bool
	// shutdown is closed when the kernel stops, ending every stream at once.
	shutdown chan struct{}
	metrics  http.Handler
	origins  *originPolicy
}

// New builds the HTTP handler.
func New(k *kernel.Kernel, opt Options) *Server {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	s := &Server{k: k, opt: opt, log: opt.Logger, shutdown: make(chan struct{}),
		metrics: promhttp.HandlerFor(k.Metrics().Registry, promhttp.HandlerOpts{}),
		origins: newOriginPolicy(opt.ListenAddr, opt.AllowedHosts, opt.AllowedOrigins)}
	s.registerRoutes()
	return s
}

// Drain turns readiness off and ends every open stream (docs/protocol/configuration.md §3).
func (s *Server) Drain() {
	if s.draining.CompareAndSwap(false, true) {
		close(s.shutdown)
	}
}

// call is the state of one request.
type call struct {
	s         *Server
	w         http.ResponseWriter
	r         *http.Request
	route     *route
	params    map[string]string
	body      []byte
	caller    kernel.Caller
	principal kernel.Principal // of a bearer caller
	requestID string
	status    int
	// waited marks a request held by wait=: it is measured apart from the
	// route's plain answers (docs/protocol/operations.md §1.2).
	waited bool
}

// answerWriteTimeout bounds the writing of a non-streaming answer (docs/protocol/http.md §9).
const answerWriteTimeout = 60 * time.Second

func (c *call) log() *slog.Logger {
	return c.s.log.With(slog.String("request_id", c.requestID), slog.String("method", c.r.Method), slog.String("path", c.r.URL.Path))
}

func (c *call) ctx() context.Context { return c.r.Context() }

// writeJSON writes one JSON value followed by a newline (docs/protocol/http.md §1).
func (c *call) writeJSON(status int, body []byte) {
	c.w.Header().Set("Content-Type", "application/json; charset=utf-8")
	c.w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	c.w.WriteHeader(status)
	c.status = status
	c.w.Write(append(body, '\n'))
}

func (c *call) noContent() {
	c.w.WriteHeader(http.StatusNoContent)
	c.status = http.StatusNoContent
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	c := &call{s: s, w: w, r: r, requestID: uuid.Must(uuid.NewV7()).String()}
	w.Header().Set(wire.HeaderRequestID, c.requestID)
	pattern := "unmatched"
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			c.log().Error("handler panic", slog.Any("panic", p))
			if c.status == 0 {
				c.writeError(errors.New("panic"))
			}
		}
		if c.waited {
			pattern += waitedRouteSuffix
		}
		level := slog.LevelDebug
		if c.status >= 400 {
			level = slog.LevelInfo
		}
		if s.log.Enabled(r.Context(), level) {
			s.log.Log(r.Context(), level, "request", slog.String("request_id", c.requestID), slog.String("method", r.Method),
				slog.String("route", pattern), slog.Int("status", c.status), slog.Duration("duration", time.Since(start)))
		}
		status := strconv.Itoa(c.status)
		m := s.k.Metrics()
		m.HTTPRequests.WithLabelValues(pattern, status).Inc()
		m.HTTPDuration.WithLabelValues(pattern, status).Observe(time.Since(start).Seconds())
	}()

	if err := s.origins.check(r); err != nil {
		c.writeError(err)
		return
	}
	rt, params, allowed := s.routes.match(r.Method, r.URL.Path)
	if rt == nil {
		if len(allowed) > 0 {
			w.Header().Set(wire.HeaderAllow, allowHeader(allowed))
			c.writeError(&kernel.Error{Code: wire.CodeMethodNotAllowed, Message: "method not allowed"})
			return
		}
		c.writeError(errRouteMissing)
		return
	}
	pattern = rt.method + " " + rt.pattern
	c.route, c.params = rt, params
	if !rt.streaming {
		// Non-streaming routes get the 60 s write timeout of docs/protocol/http.md §9.
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	}
	if err := c.readBody(); err != nil {
		c.writeError(err)
		return
	}
	if err := c.authenticate(); err != nil {
		c.writeError(err)
		return
	}
	if err := c.checkContentType(); err != nil {
		c.writeError(err)
		return
	}
	if err := rt.handle(c); err != nil {
		c.writeError(err)
	}
}

// readBody enforces the body limit of docs/protocol/http.md §3 before anything else reads it.
func (c *call) readBody() error {
	if c.route.body == bodyNone && c.route.auth != authHMAC {
		return nil
	}
	limit := c.s.opt.MaxBodyBytes
	if c.r.ContentLength > limit {
		return errTooLarge
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errTooLarge
		}
		return invalid("", "reading the request body failed")
	}
	c.body = b
	return nil
}

// authenticate applies docs/protocol/auth.md: bearer, HMAC or dual by route.
func (c *call) authenticate() error {
	kind := c.route.auth
	if kind == authDual {
		kind = authBearer
		if c.r.Header.Get(wire.HeaderAgentID) != "" || c.r.Header.Get(wire.HeaderSignature) != "" ||
			len(c.r.Header.Values(wire.HeaderAgentID)) > 0 || len(c.r.Header.Values(wire.HeaderSignature)) > 0 {
			kind = authHMAC
		}
	}
	switch kind {
	case authBearer:
		return c.authenticateBearer()
	case authHMAC:
		return c.verifySignature()
	}
	return nil
}

func (c *call) verifySignature() error {
	ids := c.r.Header.Values(wire.HeaderAgentID)
	if len(ids) != 1 || !kernel.ValidAgentID(ids[0]) {
		c.log().Info("agent authentication failed: missing or invalid agent id")
		return errUnauthorized
	}
	secret, err := c.s.k.AgentSecret(c.ctx(), ids[0])
	if errors.Is(err, store.ErrNotFound) {
		c.log().Info("agent authentication failed: unknown agent", slog.String("agent_id", ids[0]))
		return errUnauthorized
	}
	if err != nil {
		return err
	}
	err = auth.Verify(auth.Request{Method: c.r.Method, Target: c.r.RequestURI, Header: c.r.Header, Body: c.body},
		[]byte(secret), auth.Options{Now: time.Now(), RequireV1: c.s.opt.RequireV1})
	if err != nil {
		c.log().Info("agent authentication failed", slog.String("agent_id", ids[0]), slog.Any("cause", err))
		return errUnauthorized
	}
	c.caller = kernel.Caller{Agent: ids[0]}
	return nil
}
