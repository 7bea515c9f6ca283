package blackbox

// Black-box tests of resources, checkpoints, coverage and forks
// (docs/protocol/resources.md, docs/protocol/forks.md; docs/protocol/http.md §10 rows 32–37).
//
// Coverage is checked against an oracle written here from docs/protocol/resources.md §5.1 alone: it
// reads an execution's log back (resource.* payloads and the generations of
// step.executing) and never the kernel's coverage answers. Every point
// answer and every ranges answer the tests ask for is compared with it.
// Forks are checked against a model of docs/protocol/forks.md §2–§3 computed from the source's
// log and steps.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- driving executions as an agent ----

// rfAgent is a test agent that may serve several executions: webhooks for
// executions nobody waits for yet are kept for later.
type rfAgent struct {
	*kt.Agent
	t       *testing.T
	k       *kt.Kernel
	pending []kt.Webhook
}

func rfNewAgent(t *testing.T, k *kt.Kernel, id, extra string) *rfAgent {
	return &rfAgent{Agent: k.NewAgent(id, extra), t: t, k: k}
}

// webhook returns the next delivery for execution id.
func (a *rfAgent) webhook(id string) kt.Webhook {
	a.t.Helper()
	for i, wh := range a.pending {
		if wh.ExecutionID == id {
			a.pending = slices.Delete(a.pending, i, i+1)
			return wh
		}
	}
	for {
		wh := a.NextWebhook()
		if wh.ExecutionID == id {
			return wh
		}
		a.pending = append(a.pending, wh)
	}
}

// rfRun is one execution driven by an agent under one lease.
type rfRun struct {
	t     *testing.T
	k     *kt.Kernel
	a     *rfAgent
	id    string
	lease kt.Lease
}

// rfWaitEvent polls the log of id until an event matches.
func rfWaitEvent(t *testing.T, k *kt.Kernel, id, what string, match func(kt.Event) bool) kt.Event {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, ev := range k.Events(id) {
			if match(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no such event in the log of %s", what, id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func rfNum(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// rfAttach takes the next delivery of id and waits until its ack is in the
// log, so that nothing the kernel appends on its own lands between the
// events a test makes.
func rfAttach(t *testing.T, k *kt.Kernel, a *rfAgent, id string) *rfRun {
	t.Helper()
	wh := a.webhook(id)
	rfWaitEvent(t, k, id, "ack", func(ev kt.Event) bool {
		return ev.Type == "dispatch.acked" && ev.Payload["dispatch_id"] == wh.DispatchID && rfNum(ev.Payload["attempt"]) == wh.DispatchAttempt
	})
	return &rfRun{t: t, k: k, a: a, id: id, lease: kt.LeaseOf(wh)}
}

// rfBegin creates an execution and attaches to it: its log then holds
// created, started, queued and acked at 1–4, as in the examples.
func rfBegin(t *testing.T, k *kt.Kernel, a *rfAgent, input string) *rfRun {
	t.Helper()
	return rfAttach(t, k, a, k.CreateExecution(a.ID, input))
}

func (r *rfRun) path(suffix string) string { return "/v0/executions/" + r.id + suffix }

func (r *rfRun) call(method, suffix, body string) *kt.Response {
	r.t.Helper()
	return r.a.Request(method, r.path(suffix), []byte(body), r.lease)
}

func (r *rfRun) callAs(l kt.Lease, method, suffix, body string) *kt.Response {
	r.t.Helper()
	return r.a.Request(method, r.path(suffix), []byte(body), l)
}

func (r *rfRun) lastSeq() int64 { return int64(len(r.k.Events(r.id))) }

// rfView is the resource view (docs/protocol/resources.md §2).
type rfView struct {
	Key           string          `json:"key"`
	DriverID      string          `json:"driver_id"`
	Configuration json.RawMessage `json:"configuration"`
	CoverageReuse bool            `json:"coverage_reuse"`
	EverySteps    int64           `json:"every_steps"`
	OnCompletion  bool            `json:"on_completion"`
	RegisteredSeq int64           `json:"registered_seq"`
	Generation    int64           `json:"generation"`
	Binding       json.RawMessage `json:"binding"`
	CheckpointRef string          `json:"checkpoint_ref"`
	Covered       bool            `json:"covered"`
}

var rfViewFields = []string{"binding", "checkpoint_ref", "configuration", "coverage_reuse", "covered", "driver_id",
	"every_steps", "generation", "key", "on_completion", "registered_seq"}

func (r *rfRun) register(body string) rfView {
	r.t.Helper()
	resp := r.k.Must(200, r.call("POST", "/resources", body))
	var fields map[string]json.RawMessage
	resp.JSON(r.t, &fields)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if !slices.Equal(keys, rfViewFields) {
		r.t.Fatalf("resource view fields %v, want %v", keys, rfViewFields)
	}
	var v rfView
	resp.JSON(r.t, &v)
	return v
}

// rfWS is the register body of "workspace" with a policy.
func rfWS(reuse bool, every int) string {
	return fmt.Sprintf(`{"key":"workspace","driver_id":"rebuno.local_directory.v1","configuration":{"template":null},`+
		`"coverage_reuse":%v,"every_steps":%d,"on_completion":true}`, reuse, every)
}

func (r *rfRun) bind(key, binding string) {
	r.t.Helper()
	r.k.Must(204, r.call("POST", "/resources/"+key+"/binding", `{"binding":`+binding+`}`))
}

func (r *rfRun) publish(body string) {
	r.t.Helper()
	r.k.Must(204, r.call("POST", "/resources/checkpoints", body))
}

// rfCap renders one captures entry.
func rfCap(key string, gen int64, ref string) string {
	return fmt.Sprintf(`{"key":%q,"generation":%d,"checkpoint_ref":%q}`, key, gen, ref)
}

func rfCapFail(key string, gen int64, msg string) string {
	return fmt.Sprintf(`{"key":%q,"generation":%d,"error":%q}`, key, gen, msg)
}

func rfCaps(entries ...string) string { return `{"captures":[` + strings.Join(entries, ",") + `]}` }

// rfEntry is one entry of a proceed's resources.
type rfEntry struct {
	Key        string `json:"key"`
	Generation int64  `json:"generation"`
	Due        bool   `json:"due"`
}

func ent(key string, gen int64, due bool) rfEntry { return rfEntry{key, gen, due} }

// rfDecision is a step decision as these tests read it.
type rfDecision struct {
	Decision   string          `json:"decision"`
	StepID     string          `json:"step_id"`
	Resources  []rfEntry       `json:"resources"`
	Result     json.RawMessage `json:"result"`
	Error      json.RawMessage `json:"error"`
	Reason     string          `json:"reason"`
	RuleID     string          `json:"rule_id"`
	ApprovalID string          `json:"approval_id"`
	raw        []byte
}

func rfDecode(t *testing.T, resp *kt.Response) rfDecision {
	t.Helper()
	var d rfDecision
	resp.JSON(t, &d)
	d.raw = resp.Body
	var fields map[string]json.RawMessage
	resp.JSON(t, &fields)
	_, has := fields["resources"]
	if has != (d.Decision == "proceed") {
		t.Fatalf("decision %s: resources present=%v: %s", d.Decision, has, resp.Body)
	}
	if has && d.Resources == nil {
		t.Fatalf("proceed resources is not a list: %s", resp.Body)
	}
	return d
}

func (r *rfRun) submitAs(l kt.Lease, body string) rfDecision {
	r.t.Helper()
	return rfDecode(r.t, r.k.Must(200, r.callAs(l, "POST", "/steps", body)))
}

func (r *rfRun) submit(body string) rfDecision {
	r.t.Helper()
	return r.submitAs(r.lease, body)
}

// rfStepBody renders a submit body.
func rfStepBody(kind, target, args string, res ...string) string {
	b := fmt.Sprintf(`{"kind":%q,"target":%q`, kind, target)
	if args != "" {
		b += `,"args":` + args
	}
	if res != nil {
		q, _ := json.Marshal(res)
		b += `,"resources":` + string(q)
	}
	return b + "}"
}

// live submits a new step that must proceed with exactly the entries want.
func (r *rfRun) live(kind, target, args string, res []string, want ...rfEntry) string {
	r.t.Helper()
	d := r.submit(rfStepBody(kind, target, args, res...))
	if d.Decision != "proceed" || len(d.StepID) != 64 {
		r.t.Fatalf("submit %s %s: %s", kind, target, d.raw)
	}
	if want == nil {
		want = []rfEntry{}
	}
	if !slices.Equal(d.Resources, want) {
		r.t.Fatalf("submit %s %s: resources %+v, want %+v", kind, target, d.Resources, want)
	}
	return d.StepID
}

// done records a step outcome; extra adds members (captures, …) to the body.
func (r *rfRun) doneAs(l kt.Lease, stepID, verb, value, extra string) rfDecision {
	r.t.Helper()
	field := "result"
	if verb == "fail" {
		field = "error"
	}
	body := fmt.Sprintf(`{%q:%s%s}`, field, value, extra)
	return rfDecode(r.t, r.k.Must(200, r.callAs(l, "POST", "/steps/"+stepID+"/"+verb, body)))
}

func (r *rfRun) done(stepID, value, extra string) {
	r.t.Helper()
	if d := r.doneAs(r.lease, stepID, "complete", value, extra); d.Decision != "recorded" {
		r.t.Fatalf("complete %s: %s", stepID, d.raw)
	}
}

func (r *rfRun) finish() {
	r.t.Helper()
	r.k.Must(204, r.call("POST", "/complete", `{"output":{"answer":"done"}}`))
}

// since returns the events appended after seq.
func (r *rfRun) since(seq int64) []kt.Event {
	r.t.Helper()
	return r.k.Events(r.id)[seq:]
}

func rfTypes(evs []kt.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

func rfWantTypes(t *testing.T, what string, evs []kt.Event, want ...string) {
	t.Helper()
	if got := rfTypes(evs); !slices.Equal(got, want) {
		t.Fatalf("%s: events %v, want %v", what, got, want)
	}
}

// rfWantPayload compares a payload with a JSON object.
func rfWantPayload(t *testing.T, what string, ev kt.Event, want string) {
	t.Helper()
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad want %s: %v", what, want, err)
	}
	if !reflect.DeepEqual(ev.Payload, w) {
		got, _ := json.Marshal(ev.Payload)
		t.Fatalf("%s: %s payload %s, want %s", what, ev.Type, got, want)
	}
}

// rfRefusals returns the (key, generation, error) of resource.checkpoint_failed
// events, and fails on any other event type.
func rfFailures(t *testing.T, evs []kt.Event) []string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		if ev.Type != "resource.checkpoint_failed" {
			continue
		}
		if len(ev.Payload) != 3 {
			t.Fatalf("checkpoint_failed payload %v", ev.Payload)
		}
		out = append(out, fmt.Sprintf("%s@%d:%s", ev.Payload["key"], rfNum(ev.Payload["generation"]), ev.Payload["error"]))
	}
	return out
}

// rfStartKernel starts a kernel with the manual clock (no lease expires
// unless a test advances it) and one agent.
func rfStartKernel(t *testing.T, agentExtra string, args ...string) (*kt.Kernel, *rfAgent) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: args})
	return k, rfNewAgent(t, k, "coder", agentExtra)
}
