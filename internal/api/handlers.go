package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func (s *Server) registerRoutes() {
	// A bearer caller's role must allow the route: reads need viewer, and
	// every change needs admin unless the table says less.
	add := func(method, pattern string, a authKind, body bodyKind, h func(*call) error) *route {
		r := &route{method: method, pattern: pattern, auth: a, body: body, handle: h, role: wire.RoleAdmin}
		if method == http.MethodGet {
			r.role = wire.RoleViewer
		}
		s.routes.add(r)
		return r
	}
	const ex = "/v0/executions/{id}"
	add(http.MethodPost, "/v0/executions", authBearer, bodyJSON, handleCreate).needs(wire.RoleOperator)
	add(http.MethodGet, "/v0/executions", authBearer, bodyNone, handleList)
	add(http.MethodGet, ex, authDual, bodyNone, handleGet)
	add(http.MethodGet, ex+"/events", authDual, bodyNone, handleEvents)
	add(http.MethodGet, ex+"/events/stream", authDual, bodyNone, handleEventStream).streaming = true
	add(http.MethodGet, ex+"/stream", authDual, bodyNone, handleDeltaStream).streaming = true
	add(http.MethodPost, ex+"/cancel", authBearer, bodyNone, handleCancel).needs(wire.RoleOperator)
	add(http.MethodGet, ex+"/steps", authDual, bodyNone, handleSteps)
	add(http.MethodGet, ex+"/steps/{step_id}", authDual, bodyNone, handleStep)
	add(http.MethodPost, ex+"/steps", authHMAC, bodyJSON, handleSubmit)
	add(http.MethodPost, ex+"/steps/{step_id}/complete", authHMAC, bodyJSON, handleOutcome(true))
	add(http.MethodPost, ex+"/steps/{step_id}/fail", authHMAC, bodyJSON, handleOutcome(false))
	add(http.MethodPost, ex+"/steps/{step_id}/stream", authHMAC, bodyJSON, handleDelta)
	add(http.MethodPost, ex+"/heartbeat", authHMAC, bodyEmpty, handleHeartbeat)
	add(http.MethodPost, ex+"/complete", authHMAC, bodyJSON, handleComplete)
	add(http.MethodPost, ex+"/fail", authHMAC, bodyJSON, handleFail)
	add(http.MethodGet, ex+"/previous", authDual, bodyNone, handlePrevious)
	add(http.MethodPost, ex+"/fork", authBearer, bodyJSON, handleFork).needs(wire.RoleOperator)
	add(http.MethodGet, ex+"/forks", authDual, bodyNone, handleForks)
	add(http.MethodGet, ex+"/coverage", authDual, bodyNone, handleCoverage)
	add(http.MethodPost, ex+"/resources", authHMAC, bodyJSON, handleRegisterResource)
	add(http.MethodPost, ex+"/resources/{key}/binding", authHMAC, bodyJSON, handleBind)
	add(http.MethodPost, ex+"/resources/checkpoints", authHMAC, bodyJSON, handlePublish)
	add(http.MethodPost, "/v0/agents", authBearer, bodyJSON, handleRegister)
	add(http.MethodGet, "/v0/agents", authBearer, bodyNone, handleListAgents)
	add(http.MethodGet, "/v0/agents/{agent_id}", authBearer, bodyNone, handleGetAgent)
	add(http.MethodDelete, "/v0/agents/{agent_id}", authBearer, bodyNone, handleDeleteAgent)
	add(http.MethodPut, "/v0/agents/{agent_id}/metadata", authHMAC, bodyJSON, handleMetadata)
	add(http.MethodPost, "/v0/policies/{agent_id}", authBearer, bodyJSON, handlePolicy)
	add(http.MethodGet, "/v0/approvals", authBearer, bodyNone, handleListApprovals)
	add(http.MethodGet, "/v0/approvals/{approval_id}", authBearer, bodyNone, handleGetApproval)
	add(http.MethodPost, "/v0/approvals/{approval_id}/grant", authBearer, bodyJSON, handleDecide(true)).needs(wire.RoleApprover)
	add(http.MethodPost, "/v0/approvals/{approval_id}/deny", authBearer, bodyJSON, handleDecide(false)).needs(wire.RoleApprover)
	add(http.MethodPost, "/v0/keys", authBearer, bodyJSON, handleCreateKey)
	add(http.MethodGet, "/v0/keys", authBearer, bodyNone, handleListKeys).needs(wire.RoleAdmin)
	add(http.MethodDelete, "/v0/keys/{name}", authBearer, bodyNone, handleRevokeKey)
	add(http.MethodGet, "/v0/audit", authBearer, bodyNone, handleAudit).needs(wire.RoleAdmin)
	add(http.MethodGet, "/v0/whoami", authBearer, bodyNone, handleWhoami)
	add(http.MethodPost, "/v0/session", authNone, bodyNone, handleSignIn)
	add(http.MethodDelete, "/v0/session", authNone, bodyNone, handleSignOut)
	add(http.MethodGet, "/v0/execution-summaries", authBearer, bodyNone, handleSummaries)
	add(http.MethodGet, "/v0/execution-summaries/stream", authBearer, bodyNone, handleSummaryStream).streaming = true
	add(http.MethodGet, "/v0/agents/{agent_id}/last-delivery", authBearer, bodyNone, handleLastDelivery)
	add(http.MethodPost, "/v0/agents/{agent_id}/explain", authBearer, bodyJSON, handleExplain).needs(wire.RoleViewer)
	add(http.MethodGet, "/v0/health", authNone, bodyNone, handleHealth)
	add(http.MethodGet, "/v0/ready", authNone, bodyNone, handleReady)
	add(http.MethodGet, "/metrics", authNone, bodyNone, handleMetrics)
	// The test clock exists only where it works: a release build, or a test
	// build without the manual clock, answers 404 before asking for a token.
	if s.opt.ManualClock != nil {
		add(http.MethodPost, "/v0/test/clock", authBearer, bodyJSON, handleTestClock)
	}
}

// ---- parameters ----

func (c *call) executionID() (string, error) { return parseUUID("id", c.params["id"]) }

func (c *call) stepID() (string, error) {
	id := c.params["step_id"]
	if !validStepID(id) {
		return "", invalid("step_id", "step_id must be 64 lowercase hex digits")
	}
	return id, nil
}

func (c *call) agentID() (string, error) {
	id := c.params["agent_id"]
	if !kernel.ValidAgentID(id) {
		return "", invalid("agent_id", "invalid agent id")
	}
	return id, nil
}

// ---- executions ----

func handleCreate(c *call) error {
	f, err := parseBody(c.body, "agent_id", "input", "agent_version", "idempotency_key", "parent_execution_id",
		"on_behalf_of", "session", "spawned_by")
	if err != nil {
		return err
	}
	req := kernel.CreateRequest{
		AgentID: f.str("agent_id"), Input: f.raw("input"), AgentVersion: f.str("agent_version"),
		OnBehalfOf: f.str("on_behalf_of"),
	}
	bodyKey := f.str("idempotency_key")
	parent := f.str("parent_execution_id")
	if session := f.str("session"); session != "" {
		f.fail(invalid("session", "session: sessions are not supported by this kernel"))
	}
	if f.value("spawned_by") != nil {
		f.fail(invalid("spawned_by", "spawned_by: subagents are not supported by this kernel"))
	}
	if f.err != nil {
		return f.err
	}
	if f.obj.Get("agent_id") == nil || req.AgentID == "" {
		return invalid("agent_id", "agent_id is required")
	}
	if parent != "" {
		if req.ParentExecutionID, err = parseUUID("parent_execution_id", parent); err != nil {
			return err
		}
	}
	key, err := c.idempotencyKey(bodyKey, f.get("idempotency_key") != nil)
	if err != nil {
		return err
	}
	if key != "" {
		req.IdempotencyKey = key
		req.BodyHash = bodyHash(f.obj, "idempotency_key")
	}
	wait, err := c.waitParam()
	if err != nil {
		return err
	}
	if wait > 0 {
		// Held before anything is created: a refused wait creates nothing.
		release, err := c.holdWait()
		if err != nil {
			return err
		}
		defer release()
	}
	e, err := c.s.k.CreateExecution(c.ctx(), req)
	if err != nil {
		return err
	}
	if wait > 0 {
		return c.answerWhenEnded(e.ID, wait, http.StatusCreated)
	}
	c.writeJSON(http.StatusCreated, renderExecution(e).Bytes())
	return nil
}

// idempotencyKey merges the Idempotency-Key header with a body field; both
// present must agree (docs/protocol/executions.md §2).
func (c *call) idempotencyKey(bodyKey string, inBody bool) (string, error) {
	vals := c.r.Header.Values(wire.HeaderIdempotencyKey)
	if len(vals) > 1 {
		return "", invalid(wire.HeaderIdempotencyKey, "%s is repeated", wire.HeaderIdempotencyKey)
	}
	key := bodyKey
	if len(vals) == 1 {
		if err := kernel.ValidIdempotencyKey(vals[0]); err != nil {
			return "", err
		}
		if inBody && bodyKey != vals[0] {
			return "", invalid("idempotency_key", "the Idempotency-Key header and the idempotency_key field differ")
		}
		key = vals[0]
	} else if inBody {
		if err := kernel.ValidIdempotencyKey(bodyKey); err != nil {
			return "", err
		}
	}
	return key, nil
}

// bodyHash identifies a request body for idempotency: the SHA-256 of its
// canonical JSON without the named member, so a key moved between header and
// body is still the same request.
func bodyHash(obj *jsonx.Value, without string) string {
	trimmed := &jsonx.Value{Kind: jsonx.KindObject}
	for _, m := range obj.Members {
		if m.Key != without {
			trimmed.Members = append(trimmed.Members, m)
		}
	}
	sum := sha256.Sum256(jsonx.Canonical(trimmed))
	return hex.EncodeToString(sum[:])
}

func handleList(c *call) error {
	return c.listExecutions(renderExecution)
}

// page reads a list's cursor and limit parameters into f.
func (c *call) page(f *store.ExecutionFilter) error {
	cursor, err := c.query("cursor")
	if err != nil {
		return err
	}
	if cursor != "" {
		if f.Cursor, err = parseUUID("cursor", cursor); err != nil {
			return err
		}
	}
	f.Limit, err = c.limit()
	return err
}

// limit reads the limit parameter; negative values reach the kernel, which
// refuses them.
func (c *call) limit() (int, error) {
	s, err := c.query("limit")
	if err != nil || s == "" {
		return 0, err
	}
	n, err := parseInt("limit", s)
	if err != nil {
		return 0, err
	}
	if n > 1<<31 {
		n = 1 << 31
	}
	return int(n), nil
}

func handleGet(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	wait, err := c.waitParam()
	if err != nil {
		return err
	}
	if wait > 0 {
		release, err := c.holdWait()
		if err != nil {
			return err
		}
		defer release()
		return c.answerWhenEnded(id, wait, http.StatusOK)
	}
	e, err := c.s.k.GetExecution(c.ctx(), c.caller, id)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderExecution(e).Bytes())
	return nil
}

func handleEvents(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	after, err := c.query("after_seq")
	if err != nil {
		return err
	}
	var afterSeq int64
	if after != "" {
		if afterSeq, err = parseInt("after_seq", after); err != nil {
			return err
		}
	}
	limit, err := c.limit()
	if err != nil {
		return err
	}
	evs, err := c.s.k.ListEvents(c.ctx(), c.caller, id, afterSeq, limit)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderList(evs, renderEvent))
	return nil
}

func handleCancel(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	if err := c.s.k.CancelExecution(c.ctx(), id); err != nil {
		return err
	}
	c.noContent()
	return nil
}

// handleSteps streams the array page by page so that a long history is
// never held in memory whole (docs/protocol/executions.md §3).
func handleSteps(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	filter, err := c.query("status")
	if err != nil {
		return err
	}
	if _, err := kernel.StepStatusFilter(filter); err != nil {
		return err
	}
	started := false
	err = c.s.k.EachStepPage(c.ctx(), c.caller, id, filter, func(page []*store.Step) error {
		var b []byte
		for _, s := range page {
			if !started {
				c.w.Header().Set("Content-Type", "application/json; charset=utf-8")
				c.w.WriteHeader(http.StatusOK)
				c.status = http.StatusOK
				b = append(b, '[')
				started = true
			} else {
				b = append(b, ',')
			}
			b = renderStep(s).Append(b)
		}
		_, err := c.w.Write(b)
		return err
	})
	if err != nil {
		if started {
			// The status line is gone; cut the response so the client sees an
			// incomplete body rather than a wrong one.
			panic(http.ErrAbortHandler)
		}
		return err
	}
	if !started {
		c.writeJSON(http.StatusOK, []byte("[]"))
		return nil
	}
	c.w.Write([]byte("]\n"))
	return nil
}

func handleStep(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	stepID, err := c.stepID()
	if err != nil {
		return err
	}
	s, err := c.s.k.GetStep(c.ctx(), c.caller, id, stepID)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderStep(s).Bytes())
	return nil
}

func handlePrevious(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	state, err := c.s.k.Previous(c.ctx(), c.caller, id)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, (&jsonx.Object{}).Raw("state", state).Bytes())
	return nil
}

// ---- agent routes ----

// agentWrite is what every agent write carries, read in the order of docs/protocol/http.md §8:
// the execution in the path, the step when the route names one, the
// dispatch headers, and the JSON body with its known fields (none read when
// the route takes no body).
type agentWrite struct {
	id, stepID string
	h          kernel.DispatchHeaders
	f          *fields
}

func (c *call) agentWrite(withStep bool, known ...string) (*agentWrite, error) {
	w := &agentWrite{}
	var err error
	if w.id, err = c.executionID(); err != nil {
		return nil, err
	}
	if withStep {
		if w.stepID, err = c.stepID(); err != nil {
			return nil, err
		}
	}
	if w.h, err = c.dispatchHeaders(); err != nil {
		return nil, err
	}
	if len(known) > 0 {
		if w.f, err = parseBody(c.body, known...); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func handleSubmit(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	if len(c.r.Header.Values(wire.HeaderDispatchID)) == 0 {
		return kernel.MissingDispatchID()
	}
	h, err := c.dispatchHeaders()
	if err != nil {
		return err
	}
	var req kernel.SubmitRequest
	if vals := c.r.Header.Values(wire.HeaderStepOccurrence); len(vals) > 0 {
		if req.Occurrence, err = headerInt(wire.HeaderStepOccurrence, vals, 0); err != nil {
			return err
		}
		req.HasOccurrence = true
	}
	f, err := parseBody(c.body, "kind", "target", "args", "idempotency", "resources", carriedField)
	if err != nil {
		return err
	}
	req.Kind = f.str("kind")
	req.Target = f.str("target")
	if v := f.value("args"); v != nil {
		req.Args, req.ArgsValue = v.Raw, v
	}
	req.Idempotency = f.str("idempotency")
	req.Resources, _ = f.strings("resources")
	if f.err != nil {
		return f.err
	}
	if f.obj.Get("kind") == nil {
		return invalid("kind", "kind is required")
	}
	if req.Outcome, err = parseCarried(f); err != nil {
		return err
	}
	dec, err := c.s.k.SubmitStep(c.ctx(), c.caller, id, h, req)
	if err != nil {
		return err
	}
	if dec.StepID != "" {
		c.w.Header().Set(wire.HeaderStepOccurrence, strconv.FormatInt(dec.Occurrence, 10))
	}
	c.w.Header().Set(wire.HeaderExtensions, wire.ExtCarriedOutcome)
	c.writeJSON(http.StatusOK, renderDecision(dec).Bytes())
	return nil
}

func handleOutcome(succeeded bool) func(*call) error {
	field := "error"
	if succeeded {
		field = "result"
	}
	return func(c *call) error {
		w, err := c.agentWrite(true, field, "captures", "capture_failures")
		if err != nil {
			return err
		}
		caps, err := parseCaptures(w.f, "")
		if err != nil {
			return err
		}
		dec, err := c.s.k.RecordOutcome(c.ctx(), c.caller, w.id, w.stepID, w.h,
			kernel.OutcomeRequest{Succeeded: succeeded, Value: w.f.raw(field), Captures: caps})
		if err != nil {
			return err
		}
		c.writeJSON(http.StatusOK, renderDecision(dec).Bytes())
		return nil
	}
}

func handleDelta(c *call) error {
	w, err := c.agentWrite(true, "seq", "data")
	if err != nil {
		return err
	}
	f := w.f
	seq, hasSeq := f.integer("seq", 0, 1<<63-1)
	data := f.str("data")
	if f.err != nil {
		return f.err
	}
	if !hasSeq {
		return invalid("seq", "seq is required")
	}
	if v := f.get("data"); v == nil {
		return invalid("data", "data is required")
	}
	if err := c.s.k.StreamDelta(c.ctx(), c.caller, w.id, w.stepID, w.h, seq, data); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handleHeartbeat(c *call) error {
	if len(c.body) > 0 {
		return invalid("", "heartbeat body must be empty")
	}
	w, err := c.agentWrite(false)
	if err != nil {
		return err
	}
	if err := c.s.k.Heartbeat(c.ctx(), c.caller, w.id, w.h); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handleComplete(c *call) error {
	w, err := c.agentWrite(false, "output", "state", carriedField)
	if err != nil {
		return err
	}
	r := kernel.CompleteRequest{Output: w.f.raw("output"), State: w.f.raw("state")}
	if r.Outcome, err = parseCarried(w.f); err != nil {
		return err
	}
	if err := c.s.k.CompleteExecution(c.ctx(), c.caller, w.id, w.h, r); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handleFail(c *call) error {
	w, err := c.agentWrite(false, "error", carriedField)
	if err != nil {
		return err
	}
	r := kernel.FailRequest{Reason: w.f.str("error")}
	if w.f.err != nil {
		return w.f.err
	}
	if r.Outcome, err = parseCarried(w.f); err != nil {
		return err
	}
	if err := c.s.k.FailExecution(c.ctx(), c.caller, w.id, w.h, r); err != nil {
		return err
	}
	c.noContent()
	return nil
}

// ---- agents admin ----

func handleRegister(c *call) error {
	f, err := parseBody(c.body, "id", "webhook_url", "secret", "lease_timeout_seconds")
	if err != nil {
		return err
	}
	spec := kernel.AgentSpec{ID: f.str("id"), WebhookURL: f.str("webhook_url"), Secret: f.str("secret")}
	spec.LeaseTimeoutSeconds, _ = f.integer("lease_timeout_seconds", 1, wire.MaxLeaseSeconds)
	if f.err != nil {
		return f.err
	}
	a, err := c.s.k.RegisterAgent(c.ctx(), spec)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusCreated, renderAgent(a).Bytes())
	return nil
}

func handleListAgents(c *call) error {
	list, err := c.s.k.ListAgents(c.ctx())
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderList(list, renderAgent))
	return nil
}

func handleGetAgent(c *call) error {
	id, err := c.agentID()
	if err != nil {
		return err
	}
	a, err := c.s.k.GetAgent(c.ctx(), id)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderAgent(a).Bytes())
	return nil
}

func handleDeleteAgent(c *call) error {
	id, err := c.agentID()
	if err != nil {
		return err
	}
	if err := c.s.k.DeleteAgent(c.ctx(), id); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handleMetadata(c *call) error {
	id, err := c.agentID()
	if err != nil {
		return err
	}
	f, err := parseBody(c.body, "description", "input_schema", "output_schema")
	if err != nil {
		return err
	}
	m := kernel.MetadataRequest{Description: f.str("description"), InputSchema: f.object("input_schema"), OutputSchema: f.object("output_schema")}
	if f.err != nil {
		return f.err
	}
	if err := c.s.k.SetMetadata(c.ctx(), c.caller, id, m); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handlePolicy(c *call) error {
	id, err := c.agentID()
	if err != nil {
		return err
	}
	f, err := parseBody(c.body, "bundle")
	if err != nil {
		return err
	}
	bundle := f.str("bundle")
	if f.err != nil {
		return f.err
	}
	if err := c.s.k.SetPolicy(c.ctx(), id, bundle); err != nil {
		return err
	}
	c.noContent()
	return nil
}

// ---- approvals ----

func handleListApprovals(c *call) error {
	var f store.ApprovalFilter
	var err error
	if f.Status, err = c.query("status"); err != nil {
		return err
	}
	for name, dst := range map[string]*string{"execution_id": &f.ExecutionID, "after": &f.After} {
		v, err := c.query(name)
		if err != nil {
			return err
		}
		if v != "" {
			if *dst, err = parseUUID(name, v); err != nil {
				return err
			}
		}
	}
	if f.Limit, err = c.limit(); err != nil {
		return err
	}
	list, err := c.s.k.ListApprovals(c.ctx(), f)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderList(list, renderApproval))
	return nil
}

func handleGetApproval(c *call) error {
	id, err := parseUUID("approval_id", c.params["approval_id"])
	if err != nil {
		return err
	}
	a, err := c.s.k.GetApproval(c.ctx(), id)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderApproval(a).Bytes())
	return nil
}

func handleDecide(grant bool) func(*call) error {
	return func(c *call) error {
		id, err := parseUUID("approval_id", c.params["approval_id"])
		if err != nil {
			return err
		}
		f, err := parseBody(c.body, "decided_by", "rationale")
		if err != nil {
			return err
		}
		r := kernel.DecideRequest{Grant: grant, DecidedBy: f.str("decided_by"), Rationale: f.str("rationale"), By: c.principal}
		if f.err != nil {
			return f.err
		}
		if err := c.s.k.DecideApproval(c.ctx(), id, r); err != nil {
			return err
		}
		c.noContent()
		return nil
	}
}

// ---- health ----

func handleHealth(c *call) error {
	c.writeJSON(http.StatusOK, []byte(`{"status":"ok"}`))
	return nil
}

func handleReady(c *call) error {
	ctx, cancel := context.WithTimeout(c.ctx(), 2*time.Second)
	defer cancel()
	if c.s.draining.Load() || c.s.k.Ready(ctx) != nil {
		c.writeJSON(http.StatusServiceUnavailable, []byte(`{"status":"unavailable"}`))
		return nil
	}
	c.writeJSON(http.StatusOK, []byte(`{"status":"ready"}`))
	return nil
}

func handleMetrics(c *call) error {
	c.status = http.StatusOK
	c.s.metrics.ServeHTTP(c.w, c.r)
	return nil
}

func handleTestClock(c *call) error {
	mc := c.s.opt.ManualClock
	f, err := parseBody(c.body, "advance")
	if err != nil {
		return err
	}
	s := f.str("advance")
	if f.err != nil {
		return f.err
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return invalid("advance", "advance must be a positive Go duration such as \"90s\"")
	}
	now := mc.Advance(d)
	c.writeJSON(http.StatusOK, (&jsonx.Object{}).String("now", wire.FormatTime(now)).Bytes())
	return nil
}

// ---- agent secrets ----
