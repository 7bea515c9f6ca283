package blackbox

// Black-box tests of resources, checkpoints, coverage and forks
// (RESOURCES-AND-FORKS.md §3–§5; PROTOCOL.md §6 rows 32–37).
//
// Coverage is checked against an oracle written here from §4.1 alone: it
// reads an execution's log back (resource.* payloads and the generations of
// step.executing) and never the kernel's coverage answers. Every point
// answer and every ranges answer the tests ask for is compared with it.
// Forks are checked against a model of §5.2–5.3 computed from the source's
// log and steps.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
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

// rfView is the resource view (§3.1).
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

// ---- the coverage oracle (§4.1, from the log alone) ----

type rfRow struct {
	covered, inv, gen int64
	ref               string
}

type rfRes struct {
	key   string
	reg   int64
	reuse bool
	gen   int64
	rows  []*rfRow
}

type rfOracle struct {
	last  int64
	res   []*rfRes
	byKey map[string]*rfRes
	// genAt[s] is each registered key's generation after event s.
	genAt []map[string]int64
}

func rfStrings(v any) []string {
	l, _ := v.([]any)
	out := []string{}
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// rfBuildOracle replays a log. Along the way it checks what §3.3 and §3.4
// say the log must look like: each step.executing raises exactly the
// generations of the resources without coverage_reuse plus those a tool or
// local step declares, by one (in a fork's copied events, to its source's
// value, which is higher when the source's log had starts the fork did not
// copy); each checkpoint accepted by the execution itself is at the current
// generation and covers from the first event of its transaction.
func rfBuildOracle(t *testing.T, evs []kt.Event) *rfOracle {
	t.Helper()
	o := &rfOracle{byKey: map[string]*rfRes{}, genAt: []map[string]int64{{}}}
	copying := false
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.Seq)
		}
		p := ev.Payload
		key, _ := p["key"].(string)
		r := o.byKey[key]
		switch ev.Type {
		case "execution.forked":
			copying = true
		case "execution.started":
			copying = false
		case "resource.registered":
			if r != nil {
				t.Fatalf("seq %d: %q registered twice", ev.Seq, key)
			}
			r = &rfRes{key: key, reg: ev.Seq, reuse: p["coverage_reuse"] == true}
			o.res = append(o.res, r)
			o.byKey[key] = r
		case "resource.initialized":
			if r == nil {
				t.Fatalf("seq %d: initialized unregistered %q", ev.Seq, key)
			}
			r.gen = rfNum(p["generation"])
		case "step.executing":
			declared := rfStrings(p["resources"])
			llm := p["step_type"] == "llm_call"
			if _, has := p["resources"]; has && (len(declared) == 0 || llm) {
				t.Fatalf("seq %d: step.executing resources %v on a %v step", ev.Seq, p["resources"], p["step_type"])
			}
			got, has := p["generations"]
			gens, _ := got.(map[string]any)
			want := map[string]any{}
			for _, r := range o.res {
				if !r.reuse || (!llm && slices.Contains(declared, r.key)) {
					r.gen++
					if g := rfNum(gens[r.key]); copying && g >= r.gen {
						// A fork's copy keeps its source's value; the
						// starts of steps it did not copy are not in its
						// log.
						r.gen = g
					}
					want[r.key] = float64(r.gen)
					for _, row := range r.rows {
						if row.inv == 0 {
							row.inv = ev.Seq
						}
					}
				}
			}
			if has != (len(want) > 0) || (has && !reflect.DeepEqual(got, want)) {
				t.Fatalf("seq %d: step.executing generations %v, want %v", ev.Seq, got, want)
			}
		case "resource.checkpointed":
			if r == nil {
				t.Fatalf("seq %d: checkpoint of unregistered %q", ev.Seq, key)
			}
			ref, _ := p["checkpoint_ref"].(string)
			row := &rfRow{covered: rfNum(p["covered_seq"]), gen: rfNum(p["generation"]), ref: ref, inv: rfNum(p["invalidated_seq"])}
			if !copying {
				if row.gen != r.gen || row.inv != 0 || row.ref == "" || row.covered < 1 || row.covered > ev.Seq {
					t.Fatalf("seq %d: accepted checkpoint %v at generation %d", ev.Seq, p, r.gen)
				}
				for x := row.covered; x < ev.Seq; x++ {
					typ := evs[x-1].Type
					first := x == row.covered && (typ == "step.succeeded" || typ == "step.failed")
					if !first && typ != "resource.checkpointed" && typ != "resource.checkpoint_failed" {
						t.Fatalf("seq %d: checkpoint covers from %d, but %d is %s", ev.Seq, row.covered, x, typ)
					}
				}
			}
			r.rows = append(r.rows, row)
		}
		gens := map[string]int64{}
		for _, r := range o.res {
			gens[r.key] = r.gen
		}
		o.genAt = append(o.genAt, gens)
	}
	o.last = int64(len(evs))
	return o
}

// rfPoint is one resource's coverage at one seq.
type rfPoint struct {
	Key     string
	Covered bool
	Reason  string
	Ref     string // "" with no checkpoint
	Seq     int64  // 0 with no checkpoint
}

// point applies §4.1 at s.
func (o *rfOracle) point(s int64) (bool, []rfPoint) {
	all, out := true, []rfPoint{}
	for _, r := range o.res {
		if r.reg > s {
			continue
		}
		pt := rfPoint{Key: r.key, Reason: "no_checkpoint"}
		var c *rfRow
		for _, row := range r.rows {
			if row.covered <= s && (c == nil || row.covered > c.covered) {
				c = row
			}
		}
		if c != nil {
			pt.Ref, pt.Seq = c.ref, c.covered
			pt.Covered = c.inv == 0 || c.inv > s
			pt.Reason = "step_started"
			if pt.Covered {
				pt.Reason = "covered"
			}
		}
		all = all && pt.Covered
		out = append(out, pt)
	}
	return all, out
}

func (o *rfOracle) covered(s int64) bool {
	c, _ := o.point(s)
	return c
}

// keyCovered is one key's coverage at s (false before it is registered).
func (o *rfOracle) keyCovered(key string, s int64) bool {
	_, pts := o.point(s)
	for _, p := range pts {
		if p.Key == key {
			return p.Covered
		}
	}
	return false
}

// rfRanges turns per-seq booleans (index 0 is seq 1) into inclusive ranges.
func rfRanges(points []bool) [][2]int64 {
	out := [][2]int64{}
	for i, c := range points {
		s := int64(i + 1)
		switch {
		case !c:
		case len(out) > 0 && out[len(out)-1][1] == s-1:
			out[len(out)-1][1] = s
		default:
			out = append(out, [2]int64{s, s})
		}
	}
	return out
}

type rfRangesAnswer struct {
	ExecutionID  string     `json:"execution_id"`
	LastEventSeq int64      `json:"last_event_seq"`
	Ranges       [][2]int64 `json:"covered_ranges"`
	Resources    []struct {
		Key           string     `json:"key"`
		RegisteredSeq int64      `json:"registered_seq"`
		Ranges        [][2]int64 `json:"covered_ranges"`
	} `json:"resources"`
}

type rfPointAnswer struct {
	ExecutionID string `json:"execution_id"`
	AtSeq       int64  `json:"at_seq"`
	Covered     bool   `json:"covered"`
	Resources   []struct {
		Key     string  `json:"key"`
		Covered bool    `json:"covered"`
		Reason  string  `json:"reason"`
		Ref     *string `json:"checkpoint_ref"`
		Seq     *int64  `json:"checkpoint_seq"`
	} `json:"resources"`
}

func rfGetPoint(t *testing.T, k *kt.Kernel, id string, s int64) (bool, []rfPoint) {
	t.Helper()
	var a rfPointAnswer
	k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", id, s), nil, nil)).JSON(t, &a)
	if a.ExecutionID != id || a.AtSeq != s || a.Resources == nil {
		t.Fatalf("point answer at %d: %+v", s, a)
	}
	out := []rfPoint{}
	for _, r := range a.Resources {
		p := rfPoint{Key: r.Key, Covered: r.Covered, Reason: r.Reason}
		if (r.Ref == nil) != (r.Seq == nil) {
			t.Fatalf("point answer at %d: checkpoint_ref and checkpoint_seq not both present or absent", s)
		}
		if r.Ref != nil {
			p.Ref, p.Seq = *r.Ref, *r.Seq
			if p.Seq < 1 {
				t.Fatalf("point answer at %d: checkpoint_seq %d", s, p.Seq)
			}
		}
		out = append(out, p)
	}
	return a.Covered, out
}

// rfCheckCoverage compares the kernel's ranges answer and its point answer at
// every seq with the oracle, and returns the oracle and the log it read.
// The log must not grow meanwhile.
func rfCheckCoverage(t *testing.T, k *kt.Kernel, id string) (*rfOracle, []kt.Event) {
	t.Helper()
	evs := k.Events(id)
	o := rfBuildOracle(t, evs)
	var ra rfRangesAnswer
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+id+"/coverage", nil, nil))
	resp.JSON(t, &ra)
	all := make([]bool, o.last)
	for s := int64(1); s <= o.last; s++ {
		all[s-1] = o.covered(s)
	}
	if ra.ExecutionID != id || ra.LastEventSeq != o.last || ra.Ranges == nil || !reflect.DeepEqual(ra.Ranges, rfRanges(all)) {
		t.Fatalf("ranges of %s: %s; oracle: last %d, %v", id, resp.Body, o.last, rfRanges(all))
	}
	if len(ra.Resources) != len(o.res) {
		t.Fatalf("ranges of %s: resources %s, oracle %d keys", id, resp.Body, len(o.res))
	}
	for i, r := range o.res {
		per := make([]bool, o.last)
		for s := r.reg; s <= o.last; s++ {
			per[s-1] = o.keyCovered(r.key, s)
		}
		got := ra.Resources[i]
		if got.Key != r.key || got.RegisteredSeq != r.reg || got.Ranges == nil || !reflect.DeepEqual(got.Ranges, rfRanges(per)) {
			t.Fatalf("ranges of %s, key %s: %s; oracle: registered %d, %v", id, r.key, resp.Body, r.reg, rfRanges(per))
		}
	}
	for s := int64(1); s <= o.last; s++ {
		wc, wp := o.point(s)
		gc, gp := rfGetPoint(t, k, id, s)
		if gc != wc || !reflect.DeepEqual(gp, wp) {
			t.Fatalf("point answer of %s at %d: %v %+v; oracle: %v %+v", id, s, gc, gp, wc, wp)
		}
	}
	for _, bad := range []int64{0, o.last + 1} {
		r := k.Do("GET", fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", id, bad), nil, nil)
		want := fmt.Sprintf("validation error: at_seq must be between 1 and %d", o.last)
		if r.Status != 400 || r.Code() != "validation_error" || !strings.Contains(string(r.Body), want) {
			t.Fatalf("coverage at_seq=%d: %s", bad, r)
		}
	}
	return o, evs
}

// ---- the fork model (§5.2–5.3, from the source's log and steps) ----

type rfStep map[string]json.RawMessage

func (s rfStep) str(key string) string {
	var v string
	json.Unmarshal(s[key], &v)
	return v
}

func (s rfStep) num(key string) int64 {
	var v int64
	json.Unmarshal(s[key], &v)
	return v
}

func rfSteps(t *testing.T, k *kt.Kernel, id string) []rfStep {
	t.Helper()
	var out []rfStep
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps", nil, nil)).JSON(t, &out)
	return out
}

var rfCleanupCauses = map[string]bool{"execution_completed": true, "execution_failed": true,
	"execution_cancelled": true, "deadline_exceeded": true}

// rfFork is a fork as created, with what the model expected of it.
type rfFork struct {
	id          string
	exec        map[string]any
	evs         []kt.Event // its log once its first delivery was acked
	o           *rfOracle
	targets     []string // targets of the copied steps, in order
	stepIDs     map[string]string
	gen         map[string]int64 // generation of each copied key
	restoration map[string]any
	kept        int // number of kept source events
}

// rfForkAt forks src at s (201 expected) and checks the fork against the model.
func rfForkAt(t *testing.T, k *kt.Kernel, src string, s int64) *rfFork {
	t.Helper()
	before := len(k.Events(src))
	resp := k.Do("POST", "/v0/executions/"+src+"/fork", fmt.Appendf(nil, `{"at_seq":%d}`, s), nil)
	if resp.Status != 201 {
		t.Fatalf("fork %s at %d: %s", src, s, resp)
	}
	f := rfCheckFork(t, k, src, s, resp.Map(t))
	if after := len(k.Events(src)); after != before {
		t.Fatalf("forking appended %d events to the source", after-before)
	}
	return f
}

func rfCheckFork(t *testing.T, k *kt.Kernel, src string, s int64, exec map[string]any) *rfFork {
	t.Helper()
	f := &rfFork{id: exec["id"].(string), exec: exec, stepIDs: map[string]string{}, gen: map[string]int64{}}
	srcExec := k.Execution(src)
	srcEvs := k.Events(src)
	so := rfBuildOracle(t, srcEvs)
	srcSteps := rfSteps(t, k, src)

	// Copied steps: terminal (succeeded, failed, denied) at s, except
	// denials of a terminal clean-up.
	terminal := map[string]int64{}
	for _, ev := range srcEvs {
		switch ev.Type {
		case "step.succeeded", "step.failed", "step.denied", "step.cancelled":
			terminal[ev.Payload["step_id"].(string)] = ev.Seq
		}
	}
	var copied []rfStep
	isCopied := map[string]bool{}
	for _, st := range srcSteps {
		id, status := st.str("step_id"), st.str("status")
		if status != "succeeded" && status != "failed" && status != "denied" {
			continue
		}
		if ts := terminal[id]; ts == 0 || ts > s {
			continue
		}
		if status == "denied" {
			var e struct{ Reason string }
			json.Unmarshal(st["error"], &e)
			if rfCleanupCauses[e.Reason] {
				continue
			}
		}
		copied = append(copied, st)
		isCopied[id] = true
		f.stepIDs[id] = identity.StepID(f.id, st.str("kind"), st.str("target"), st.str("args_hash"), st.num("occurrence"))
		f.targets = append(f.targets, st.str("target"))
	}
	// Copied keys and kept events.
	var keys []string
	var kept []kt.Event
	for _, ev := range srcEvs[:s] {
		if ev.Type == "resource.registered" {
			keys = append(keys, ev.Payload["key"].(string))
		}
	}
	for _, ev := range srcEvs[:s] {
		switch {
		case ev.Type == "resource.registered" || ev.Type == "resource.initialized":
			if slices.Contains(keys, ev.Payload["key"].(string)) {
				kept = append(kept, ev)
			}
		case strings.HasPrefix(ev.Type, "step.") && ev.Type != "step.rate_limited":
			if id, _ := ev.Payload["step_id"].(string); isCopied[id] {
				kept = append(kept, ev)
			}
		}
	}
	f.kept = len(kept)
	mapSeq := func(x int64) int64 {
		n := int64(0)
		for _, ev := range kept {
			if ev.Seq <= x {
				n++
			}
		}
		if n == 0 {
			return 2
		}
		return 2 + n
	}
	// Restoration, initialization and checkpoint copies.
	_, points := so.point(s)
	restoration := map[string]any{}
	var inits, ckpts []map[string]any
	for _, key := range keys {
		var pt rfPoint
		for _, p := range points {
			if p.Key == key {
				pt = p
			}
		}
		entry := map[string]any{"covered": pt.Covered}
		init := map[string]any{"key": key}
		gen := so.genAt[s][key]
		if !pt.Covered {
			gen++
		}
		init["generation"] = float64(gen)
		f.gen[key] = gen
		if pt.Seq != 0 {
			entry["checkpoint_ref"], entry["checkpoint_seq"] = pt.Ref, float64(pt.Seq)
			init["checkpoint_ref"] = pt.Ref
		}
		restoration[key] = entry
		inits = append(inits, init)
		rows := slices.Clone(so.byKey[key].rows)
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].covered < rows[j].covered })
		var mine []map[string]any
		for _, row := range rows {
			if row.covered > s {
				continue
			}
			c := map[string]any{"key": key, "generation": float64(row.gen), "checkpoint_ref": row.ref,
				"covered_seq": float64(mapSeq(row.covered))}
			if row.inv != 0 && row.inv <= s {
				c["invalidated_seq"] = float64(mapSeq(row.inv))
			}
			if n := len(mine); n > 0 && mine[n-1]["covered_seq"] == c["covered_seq"] {
				mine[n-1] = c
				continue
			}
			mine = append(mine, c)
		}
		ckpts = append(ckpts, mine...)
	}
	f.restoration = restoration

	// The fork's Execution.
	if exec["status"] != "running" || exec["forked_from"] != src || rfNum(exec["fork_seq"]) != s ||
		!reflect.DeepEqual(exec["restoration"], restoration) || exec["agent_id"] != srcExec["agent_id"] ||
		!reflect.DeepEqual(exec["input"], srcExec["input"]) || exec["agent_version"] != srcExec["agent_version"] ||
		exec["parent_execution_id"] != srcExec["parent_execution_id"] || exec["on_behalf_of"] != srcExec["on_behalf_of"] {
		t.Fatalf("fork execution %v (source %v, restoration %v)", exec, srcExec, restoration)
	}
	if got := rfStrings(exec["resource_keys"]); !slices.Equal(got, append([]string{}, keys...)) {
		t.Fatalf("fork resource_keys %v, want %v", got, keys)
	}
	if !reflect.DeepEqual(k.Execution(f.id)["restoration"], restoration) {
		t.Fatalf("fork read back: restoration %v", k.Execution(f.id)["restoration"])
	}

	// The fork's log, once its first delivery is acked.
	rfWaitEvent(t, k, f.id, "fork ack", func(ev kt.Event) bool { return ev.Type == "dispatch.acked" })
	evs := k.Events(f.id)
	f.evs = evs
	n := 2 + len(kept) + len(inits) + len(ckpts) + 2
	if len(evs) != n+1 || evs[n].Type != "dispatch.acked" {
		t.Fatalf("fork log has %d events %v, want %d and the ack", len(evs), rfTypes(evs), n)
	}
	if evs[0].Type != "execution.created" || evs[0].Payload["execution_id"] != f.id || evs[0].Payload["status"] != "pending" {
		t.Fatalf("fork event 1: %s %v", evs[0].Type, evs[0].Payload)
	}
	forked := map[string]any{"source_execution_id": src, "fork_seq": float64(s), "restoration": restoration}
	if evs[1].Type != "execution.forked" || !reflect.DeepEqual(evs[1].Payload, forked) {
		t.Fatalf("fork event 2: %s %v, want %v", evs[1].Type, evs[1].Payload, forked)
	}
	for i, src := range kept {
		got := evs[2+i]
		want := map[string]any{}
		for k, v := range src.Payload {
			want[k] = v
		}
		if id, ok := want["step_id"].(string); ok {
			want["step_id"] = f.stepIDs[id]
		}
		if got.Type != src.Type || got.OccurredAt != src.OccurredAt || !reflect.DeepEqual(got.Payload, want) {
			t.Fatalf("fork event %d: %s %v at %s; want the source's %d: %s %v at %s", got.Seq, got.Type, got.Payload,
				got.OccurredAt, src.Seq, src.Type, want, src.OccurredAt)
		}
	}
	at := 2 + len(kept)
	for _, init := range inits {
		if evs[at].Type != "resource.initialized" || !reflect.DeepEqual(evs[at].Payload, init) {
			t.Fatalf("fork event %d: %s %v, want resource.initialized %v", at+1, evs[at].Type, evs[at].Payload, init)
		}
		at++
	}
	for _, c := range ckpts {
		if evs[at].Type != "resource.checkpointed" || !reflect.DeepEqual(evs[at].Payload, c) {
			t.Fatalf("fork event %d: %s %v, want resource.checkpointed %v", at+1, evs[at].Type, evs[at].Payload, c)
		}
		at++
	}
	if evs[at].Type != "execution.started" || evs[at+1].Type != "dispatch.queued" || evs[at+1].Payload["execution_id"] != f.id {
		t.Fatalf("fork events %d–%d: %v", at+1, at+2, rfTypes(evs[at:]))
	}

	// The copied steps: same rows under new ids, sharing the bodies.
	steps := rfSteps(t, k, f.id)
	if len(steps) != len(copied) {
		t.Fatalf("fork has %d steps, want %d copies", len(steps), len(copied))
	}
	for i, st := range steps {
		from := copied[i]
		if st.str("step_id") != f.stepIDs[from.str("step_id")] || st.str("execution_id") != f.id {
			t.Fatalf("fork step %d: id %s, want %s", i, st.str("step_id"), f.stepIDs[from.str("step_id")])
		}
		for _, field := range []string{"kind", "target", "args_hash", "occurrence", "status", "idempotency", "args",
			"resources", "result", "error", "started_at", "completed_at"} {
			if !bytes.Equal(st[field], from[field]) {
				t.Fatalf("fork step %d %s: %s, source %s", i, field, st[field], from[field])
			}
		}
	}

	// Coverage: the fork's own answers against the oracle, and §5.3's
	// mapping: a copied position answers as the last source seq it stands
	// for, and the rest of the creation transaction as s.
	f.o, _ = rfCheckCoverage(t, k, f.id)
	for p := int64(1); p <= int64(n); p++ {
		want := true
		switch {
		case p <= 2:
		case p <= int64(2+len(kept)):
			last := s
			if i := int(p - 2); i < len(kept) {
				last = kept[i].Seq - 1
			}
			want = so.covered(last)
		default:
			want = so.covered(s)
		}
		if got := f.o.covered(p); got != want {
			t.Fatalf("fork of %s at %d: covered at %d is %v, the source's answer is %v", src, s, p, got, want)
		}
	}
	return f
}

// ---- Examples A–F (§4.3) ----

// rfForkWant is one row of an example's fork table, in the example's
// numbering.
type rfForkWant struct {
	at      int64
	none    bool // no resource registered at the point
	covered bool
	ref     string // the restored checkpoint's ref ("" for the initial environment)
	refAt   int64  // its covered_seq
	copied  []string
	gen     int64
}

type rfEx struct {
	t     *testing.T
	k     *kt.Kernel
	a     *rfAgent
	r     *rfRun
	real  []int64 // real[c-1] is the seq of the example's event c
	o     *rfOracle
	forks map[int64]*rfFork
}

// seq translates the example's numbering to the log's.
func (x *rfEx) seq(c int64) int64 { return x.real[c-1] }

type rfExample struct {
	name string
	// full: the example lists every event; otherwise it omits
	// step.proposed and step.allowed and numbers as if they did not exist.
	full   bool
	script func(x *rfEx)
	types  []string        // the log, in the example's numbering
	gens   map[int64]int64 // workspace generation after an event
	ranges [][2]int64      // covered ranges, in the example's numbering
	forks  []rfForkWant
	after  func(x *rfEx)
}

const (
	evCreated   = "execution.created"
	evStarted   = "execution.started"
	evQueued    = "dispatch.queued"
	evAcked     = "dispatch.acked"
	evReg       = "resource.registered"
	evBound     = "resource.bound"
	evCkpt      = "resource.checkpointed"
	evCkptFail  = "resource.checkpoint_failed"
	evInit      = "resource.initialized"
	evProposed  = "step.proposed"
	evAllowed   = "step.allowed"
	evExecuting = "step.executing"
	evSucceeded = "step.succeeded"
	evCompleted = "execution.completed"
)

func rfHead(more ...string) []string {
	return append([]string{evCreated, evStarted, evQueued, evAcked, evReg, evBound}, more...)
}

var ws = []string{"workspace"}

// rfSetup registers workspace with a policy, binds it and, when baseline is
// not "", publishes the baseline at generation 0 (events 5, 6, 7).
func (x *rfEx) setup(reuse bool, every int, baseline string) {
	v := x.r.register(rfWS(reuse, every))
	if v.RegisteredSeq != 5 || v.Generation != 0 || v.Covered || string(v.Binding) != "null" || v.CheckpointRef != "" ||
		v.EverySteps != int64(every) || v.CoverageReuse != reuse || !v.OnCompletion || string(v.Configuration) != `{"template":null}` {
		x.t.Fatalf("new resource view %+v", v)
	}
	x.r.bind("workspace", `{"path":"/tmp/ws-1"}`)
	if baseline != "" {
		x.r.publish(rfCaps(rfCap("workspace", 0, baseline)))
	}
}

// step runs one step to success; caps is the complete body's extra members.
func (x *rfEx) step(kind, target string, res []string, want []rfEntry, caps string) string {
	id := x.r.live(kind, target, fmt.Sprintf(`{"n":%q}`, target), res, want...)
	x.r.done(id, fmt.Sprintf(`"did %s"`, target), caps)
	return id
}

func rfExamples() []rfExample {
	e := func(gen int64, due bool) []rfEntry { return []rfEntry{ent("workspace", gen, due)} }
	withCaps := func(entries ...string) string { return `,"captures":[` + strings.Join(entries, ",") + `]` }
	return []rfExample{
		{
			name: "A every_steps=1, the docs' agent",
			full: true,
			script: func(x *rfEx) {
				x.setup(false, 1, "B0")
				x.step("llm_call", "gpt", nil, e(1, false), "")
				x.step("tool_call", "write_file", ws, e(2, true), withCaps(rfCap("workspace", 2, "C1")))
				x.step("llm_call", "gpt2", nil, e(3, false), "")
				x.step("tool_call", "read_file", nil, e(4, false), "")
				x.step("llm_call", "gpt3", nil, e(5, false), "")
				// The handler returns; the completion capture is due since
				// the view says uncovered.
				if v := x.r.register(rfWS(false, 1)); v.Covered || v.Generation != 5 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.publish(rfCaps(rfCap("workspace", 5, "C2")))
				x.r.finish()
			},
			types: rfHead(evCkpt,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evProposed, evAllowed, evExecuting, evSucceeded, evCkpt,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evCkpt, evCompleted),
			gens:   map[int64]int64{5: 0, 7: 0, 9: 0, 10: 1, 14: 2, 16: 2, 19: 3, 23: 4, 27: 5, 29: 5, 30: 5},
			ranges: [][2]int64{{1, 4}, {7, 9}, {15, 18}, {29, 30}},
			forks: []rfForkWant{
				{at: 3, none: true},
				{at: 6, covered: false, gen: 1},
				{at: 7, covered: true, ref: "B0", refAt: 7, gen: 0},
				{at: 9, covered: true, ref: "B0", refAt: 7, gen: 0},
				{at: 11, covered: false, ref: "B0", refAt: 7, copied: []string{"gpt"}, gen: 2},
				{at: 14, covered: false, ref: "B0", refAt: 7, copied: []string{"gpt"}, gen: 3},
				{at: 15, covered: true, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file"}, gen: 2},
				{at: 18, covered: true, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file"}, gen: 2},
				{at: 20, covered: false, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file", "gpt2"}, gen: 4},
				{at: 28, covered: false, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file", "gpt2", "read_file", "gpt3"}, gen: 6},
				{at: 29, covered: true, ref: "C2", refAt: 29, copied: []string{"gpt", "write_file", "gpt2", "read_file", "gpt3"}, gen: 5},
				{at: 30, covered: true, ref: "C2", refAt: 29, copied: []string{"gpt", "write_file", "gpt2", "read_file", "gpt3"}, gen: 5},
			},
			after: rfAfterA,
		},
		{
			name: "B every_steps=3, consecutive writes",
			script: func(x *rfEx) {
				x.setup(false, 3, "B0")
				x.step("tool_call", "w1", ws, e(1, false), "")
				x.step("tool_call", "w2", ws, e(2, false), "")
				x.step("tool_call", "w3", ws, e(3, true), withCaps(rfCap("workspace", 3, "P1")))
				x.step("tool_call", "w4", ws, e(4, false), "")
				if v := x.r.register(rfWS(false, 3)); v.Covered || v.Generation != 4 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.publish(rfCaps(rfCap("workspace", 4, "C")))
				x.r.finish()
			},
			types: rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt,
				evExecuting, evSucceeded, evCkpt, evCompleted),
			gens:   map[int64]int64{7: 0, 8: 1, 9: 1, 10: 2, 11: 2, 12: 3, 13: 3, 14: 3, 15: 4, 16: 4, 17: 4, 18: 4},
			ranges: [][2]int64{{1, 4}, {7, 7}, {13, 14}, {17, 18}},
			forks: []rfForkWant{
				{at: 11, covered: false, ref: "B0", refAt: 7, copied: []string{"w1", "w2"}, gen: 3},
				{at: 13, covered: true, ref: "P1", refAt: 13, copied: []string{"w1", "w2", "w3"}, gen: 3},
				{at: 16, covered: false, ref: "P1", refAt: 13, copied: []string{"w1", "w2", "w3", "w4"}, gen: 5},
			},
		},
		{
			name: "C coverage_reuse on",
			script: func(x *rfEx) {
				x.setup(true, 1, "B0")
				x.step("tool_call", "read_file", nil, nil, "")
				x.step("tool_call", "write_file", ws, e(1, true), withCaps(rfCap("workspace", 1, "P1")))
				x.step("local", "lint", nil, nil, "")
				x.step("llm_call", "gpt", nil, nil, "")
				// Still covered at the end: no completion capture.
				if v := x.r.register(rfWS(true, 1)); !v.Covered || v.Generation != 1 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.finish()
			},
			types: rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt,
				evExecuting, evSucceeded, evExecuting, evSucceeded, evCompleted),
			gens:   map[int64]int64{7: 0, 8: 0, 9: 0, 10: 1, 11: 1, 12: 1, 13: 1, 14: 1, 15: 1, 16: 1, 17: 1},
			ranges: [][2]int64{{1, 4}, {7, 9}, {11, 17}},
			forks: []rfForkWant{
				{at: 9, covered: true, ref: "B0", refAt: 7, copied: []string{"read_file"}, gen: 0},
				{at: 10, covered: false, ref: "B0", refAt: 7, copied: []string{"read_file"}, gen: 2},
				{at: 16, covered: true, ref: "P1", refAt: 11, copied: []string{"read_file", "write_file", "lint", "gpt"}, gen: 1},
			},
		},
		{
			name: "C coverage_reuse off",
			script: func(x *rfEx) {
				x.setup(false, 1, "B0")
				x.step("tool_call", "read_file", nil, e(1, false), "")
				x.step("tool_call", "write_file", ws, e(2, true), withCaps(rfCap("workspace", 2, "P1")))
				x.step("local", "lint", nil, e(3, false), "")
				x.step("llm_call", "gpt", nil, e(4, false), "")
				if v := x.r.register(rfWS(false, 1)); v.Covered || v.Generation != 4 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.publish(rfCaps(rfCap("workspace", 4, "C2")))
				x.r.finish()
			},
			types: rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt,
				evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt, evCompleted),
			gens:   map[int64]int64{7: 0, 8: 1, 10: 2, 12: 2, 13: 3, 15: 4, 17: 4, 18: 4},
			ranges: [][2]int64{{1, 4}, {7, 7}, {11, 12}, {17, 18}},
			forks: []rfForkWant{
				{at: 12, covered: true, ref: "P1", refAt: 11, copied: []string{"read_file", "write_file"}, gen: 2},
				{at: 14, covered: false, ref: "P1", refAt: 11, copied: []string{"read_file", "write_file", "lint"}, gen: 4},
			},
		},
		{
			name: "D capture failure",
			script: func(x *rfEx) {
				x.setup(false, 1, "B0")
				x.step("tool_call", "w1", ws, e(1, true), `,"capture_failures":[`+rfCapFail("workspace", 1, "snapshot quota exceeded")+`]`)
				// The counter stayed at 1: w2 is due again.
				x.step("tool_call", "w2", ws, e(2, true), withCaps(rfCap("workspace", 2, "P2")))
			},
			types:  rfHead(evCkpt, evExecuting, evSucceeded, evCkptFail, evExecuting, evSucceeded, evCkpt),
			gens:   map[int64]int64{7: 0, 8: 1, 9: 1, 10: 1, 11: 2, 12: 2, 13: 2},
			ranges: [][2]int64{{1, 4}, {7, 7}, {12, 13}},
			forks: []rfForkWant{
				{at: 10, covered: false, ref: "B0", refAt: 7, copied: []string{"w1"}, gen: 2},
				{at: 12, covered: true, ref: "P2", refAt: 12, copied: []string{"w1", "w2"}, gen: 2},
			},
			after: rfAfterD,
		},
		{
			name: "E uncovered fork, its log, and forks of it",
			script: func(x *rfEx) {
				x.setup(false, 5, "B0")
				x.step("tool_call", "w1", ws, e(1, false), "")
				x.step("tool_call", "w2", ws, e(2, false), "")
				x.step("tool_call", "w3", ws, e(3, false), "")
				x.step("llm_call", "gpt", nil, e(4, false), "")
			},
			types:  rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded),
			gens:   map[int64]int64{7: 0, 8: 1, 10: 2, 12: 3, 14: 4, 15: 4},
			ranges: [][2]int64{{1, 4}, {7, 7}},
			forks: []rfForkWant{
				{at: 11, covered: false, ref: "B0", refAt: 7, copied: []string{"w1", "w2"}, gen: 3},
				{at: 15, covered: false, ref: "B0", refAt: 7, copied: []string{"w1", "w2", "w3", "gpt"}, gen: 5},
			},
			after: rfAfterE,
		},
		{
			name: "F no checkpoint at all",
			script: func(x *rfEx) {
				x.setup(false, 2, "")
				x.r.publish(`{"capture_failures":[` + rfCapFail("workspace", 0, "baseline failed") + `]}`)
				x.step("tool_call", "w1", ws, e(1, false), "")
				x.step("tool_call", "w2", ws, e(2, true), withCaps(rfCap("workspace", 2, "P1")))
			},
			types:  rfHead(evCkptFail, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt),
			gens:   map[int64]int64{7: 0, 8: 1, 10: 2, 12: 2},
			ranges: [][2]int64{{1, 4}, {11, 12}},
			forks: []rfForkWant{
				{at: 9, covered: false, copied: []string{"w1"}, gen: 2},
			},
			after: rfAfterF,
		},
	}
}

// TestResourceExamples reproduces Examples A–F of RESOURCES-AND-FORKS §4.3
// over HTTP: each log exactly, the `due` answers, the generations, the
// ranges, the point answer at every seq (against the oracle), and each fork
// of the example's table with its log and rows (against the fork model).
func TestResourceExamples(t *testing.T) {
	for _, ex := range rfExamples() {
		t.Run(ex.name, func(t *testing.T) {
			k, a := rfStartKernel(t, "")
			x := &rfEx{t: t, k: k, a: a, r: rfBegin(t, k, a, `{"task":"example"}`), forks: map[int64]*rfFork{}}
			ex.script(x)
			evs := k.Events(x.r.id)
			for _, ev := range evs {
				if ex.full || (ev.Type != evProposed && ev.Type != evAllowed) {
					x.real = append(x.real, ev.Seq)
				}
			}
			var got []string
			for _, s := range x.real {
				got = append(got, evs[s-1].Type)
			}
			if !slices.Equal(got, ex.types) {
				t.Fatalf("log (example numbering):\n got %v\nwant %v", got, ex.types)
			}
			x.o, _ = rfCheckCoverage(t, k, x.r.id)
			for c, g := range ex.gens {
				if got := x.o.genAt[x.seq(c)]["workspace"]; got != g {
					t.Fatalf("generation after %d: %d, want %d", c, got, g)
				}
			}
			var points []bool
			for c := range x.real {
				points = append(points, x.o.covered(x.seq(int64(c+1))))
			}
			if got := rfRanges(points); !reflect.DeepEqual(got, ex.ranges) {
				t.Fatalf("covered ranges (example numbering) %v, want %v", got, ex.ranges)
			}
			// Events the example omits answer as the event before them.
			for s := int64(2); s <= x.o.last; s++ {
				if typ := evs[s-1].Type; !ex.full && (typ == evProposed || typ == evAllowed) && x.o.covered(s) != x.o.covered(s-1) {
					t.Fatalf("coverage changes at %s (%d)", typ, s)
				}
			}
			for _, fw := range ex.forks {
				f := rfForkAt(t, k, x.r.id, x.seq(fw.at))
				x.forks[fw.at] = f
				what := fmt.Sprintf("fork at %d", fw.at)
				if !slices.Equal(f.targets, fw.copied) {
					t.Fatalf("%s copied %v, want %v", what, f.targets, fw.copied)
				}
				if fw.none {
					if len(f.restoration) != 0 || len(f.gen) != 0 {
						t.Fatalf("%s: restoration %v", what, f.restoration)
					}
					continue
				}
				want := map[string]any{"covered": fw.covered}
				if fw.ref != "" {
					want["checkpoint_ref"], want["checkpoint_seq"] = fw.ref, float64(x.seq(fw.refAt))
				}
				if !reflect.DeepEqual(f.restoration["workspace"], want) || f.gen["workspace"] != fw.gen {
					t.Fatalf("%s: restoration %v generation %d, want %v generation %d", what, f.restoration, f.gen["workspace"], want, fw.gen)
				}
			}
			if ex.after != nil {
				ex.after(x)
			}
		})
	}
}

// rfAfterA checks the point answer the spec shows, the log of fork(A, 15)
// row by row, and that fork's first dispatch.
func rfAfterA(x *rfEx) {
	t, k := x.t, x.k
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+x.r.id+"/coverage?at_seq=23", nil, nil))
	var pa map[string]any
	resp.JSON(t, &pa)
	want := map[string]any{"execution_id": x.r.id, "at_seq": 23.0, "covered": false, "resources": []any{
		map[string]any{"key": "workspace", "covered": false, "reason": "step_started", "checkpoint_ref": "C1", "checkpoint_seq": 15.0}}}
	if !reflect.DeepEqual(pa, want) {
		t.Fatalf("point answer at 23: %s", resp.Body)
	}
	if _, pts := rfGetPoint(t, k, x.r.id, 6); len(pts) != 1 || pts[0].Reason != "no_checkpoint" || pts[0].Ref != "" {
		t.Fatalf("point answer at 6: %+v", pts)
	}
	if c, pts := rfGetPoint(t, k, x.r.id, 3); !c || len(pts) != 0 {
		t.Fatalf("point answer at 3: %v %+v", c, pts)
	}

	f := x.forks[15]
	rfWantTypes(t, "fork(A, 15)", f.evs, evCreated, "execution.forked", evReg,
		evProposed, evAllowed, evExecuting, evSucceeded, evProposed, evAllowed, evExecuting, evSucceeded,
		evInit, evCkpt, evCkpt, evStarted, evQueued, evAcked)
	rfWantPayload(t, "fork(A, 15) 2", f.evs[1], fmt.Sprintf(`{"source_execution_id":%q,"fork_seq":15,`+
		`"restoration":{"workspace":{"checkpoint_ref":"C1","checkpoint_seq":15,"covered":true}}}`, x.r.id))
	rfWantPayload(t, "fork(A, 15) 12", f.evs[11], `{"key":"workspace","generation":2,"checkpoint_ref":"C1"}`)
	rfWantPayload(t, "fork(A, 15) 13", f.evs[12], `{"key":"workspace","generation":0,"checkpoint_ref":"B0","covered_seq":3,"invalidated_seq":6}`)
	rfWantPayload(t, "fork(A, 15) 14", f.evs[13], `{"key":"workspace","generation":2,"checkpoint_ref":"C1","covered_seq":11}`)
	var cov []bool
	for p := int64(1); p <= 16; p++ {
		cov = append(cov, f.o.covered(p))
	}
	if got := rfRanges(cov); !reflect.DeepEqual(got, [][2]int64{{1, 5}, {11, 16}}) {
		t.Fatalf("fork(A, 15) coverage %v", got)
	}
	// Its first dispatch: the view restores C1, covered; the stored policy
	// wins over a different one; bind; the copies replay.
	r := rfAttach(t, k, x.a, f.id)
	v := r.register(rfWS(false, 7))
	if !v.Covered || v.CheckpointRef != "C1" || v.Generation != 2 || v.RegisteredSeq != 3 || v.EverySteps != 1 || string(v.Binding) != "null" {
		t.Fatalf("fork(A, 15) view %+v", v)
	}
	r.bind("workspace", `{"path":"/tmp/ws-2"}`)
	for _, target := range []string{"gpt", "write_file"} {
		kind := "llm_call"
		if target == "write_file" {
			kind = "tool_call"
		}
		var res []string
		if kind == "tool_call" {
			res = ws
		}
		d := r.submit(rfStepBody(kind, target, fmt.Sprintf(`{"n":%q}`, target), res...))
		if d.Decision != "replay" || d.StepID != f.stepIDs[x.stepOf(target)] || string(d.Result) != fmt.Sprintf(`"did %s"`, target) {
			t.Fatalf("fork(A, 15) replay of %s: %s", target, d.raw)
		}
	}
	if evs := k.Events(f.id); rfTypes(evs)[len(evs)-1] != evBound {
		t.Fatalf("replays wrote events: %v", rfTypes(evs[17:]))
	}
	r.finish()
}

// stepOf returns the source step id of a target.
func (x *rfEx) stepOf(target string) string {
	for _, st := range rfSteps(x.t, x.k, x.r.id) {
		if st.str("target") == target {
			return st.str("step_id")
		}
	}
	x.t.Fatalf("no step %s", target)
	return ""
}

// rfAfterD: a capture of generation 1 reported after w2's start is refused
// as stale_generation; it changes no coverage.
func rfAfterD(x *rfEx) {
	seq := x.r.lastSeq()
	x.r.publish(rfCaps(rfCap("workspace", 1, "late")))
	evs := x.r.since(seq)
	rfWantTypes(x.t, "late capture", evs, evCkptFail)
	rfWantPayload(x.t, "late capture", evs[0], `{"key":"workspace","generation":1,"error":"stale_generation"}`)
	o, _ := rfCheckCoverage(x.t, x.k, x.r.id)
	if !o.covered(x.seq(13)) || !o.covered(o.last) || o.last != x.seq(13)+1 {
		x.t.Fatal("a refused capture changed coverage")
	}
}

// rfAfterE runs F = fork(P, 15) as the example does, then forks F at 7, 13
// and 18.
func rfAfterE(x *rfEx) {
	t, k := x.t, x.k
	f := x.forks[15]
	var compressed []kt.Event
	for _, ev := range f.evs {
		if ev.Type != evProposed && ev.Type != evAllowed {
			compressed = append(compressed, ev)
		}
	}
	rfWantTypes(t, "F's log", compressed, evCreated, "execution.forked", evReg,
		evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded,
		evInit, evCkpt, evStarted, evQueued, evAcked)
	// Run F's first dispatch. F's log numbers as the example's once the
	// copies of proposed/allowed are left out, as the example does.
	r := rfAttach(t, k, x.a, f.id)
	var fReal []int64
	renumber := func() {
		fReal = fReal[:0]
		for _, ev := range k.Events(f.id) {
			if ev.Type != evProposed && ev.Type != evAllowed {
				fReal = append(fReal, ev.Seq)
			}
		}
	}
	renumber()
	if len(fReal) != 16 {
		t.Fatalf("F has %d events in the example's numbering", len(fReal))
	}
	fev := k.Events(f.id)
	rfWantPayload(t, "F 2", fev[fReal[1]-1], fmt.Sprintf(`{"source_execution_id":%q,"fork_seq":%d,`+
		`"restoration":{"workspace":{"checkpoint_ref":"B0","checkpoint_seq":%d,"covered":false}}}`, x.r.id, x.seq(15), x.seq(7)))
	rfWantPayload(t, "F 12", fev[fReal[11]-1], `{"key":"workspace","generation":5,"checkpoint_ref":"B0"}`)
	rfWantPayload(t, "F 13", fev[fReal[12]-1], fmt.Sprintf(`{"key":"workspace","generation":0,"checkpoint_ref":"B0","covered_seq":3,"invalidated_seq":%d}`,
		fReal[3]))
	v := r.register(rfWS(false, 2))
	if v.Covered || v.CheckpointRef != "B0" || v.Generation != 5 || v.EverySteps != 5 || v.RegisteredSeq != 3 {
		t.Fatalf("F's view %+v", v)
	}
	r.bind("workspace", `{"path":"/tmp/ws-F"}`)    // 17
	r.publish(rfCaps(rfCap("workspace", 5, "B1"))) // 18: the baseline
	seq := r.lastSeq()
	for _, target := range []string{"w1", "w2", "w3", "gpt"} {
		kind, res := "tool_call", ws
		if target == "gpt" {
			kind, res = "llm_call", nil
		}
		if d := r.submit(rfStepBody(kind, target, fmt.Sprintf(`{"n":%q}`, target), res...)); d.Decision != "replay" {
			t.Fatalf("F replay of %s: %s", target, d.raw)
		}
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("replays appended %d events", n)
	}
	w4 := r.live("tool_call", "w4", `{"n":"w4"}`, ws, ent("workspace", 6, false)) // 19: F's counter is 1
	r.done(w4, `"did w4"`, "")                                                    // 20
	renumber()
	if len(fReal) != 20 {
		t.Fatalf("F has %d events in the example's numbering, want 20", len(fReal))
	}
	fo, fev := rfCheckCoverage(t, k, f.id)
	for c := int64(1); c <= 20; c++ {
		want := c <= 3 || c == 18 // 1–2 vacuous, 3 (P's 5–7), 18 (B1)
		if got := fo.covered(fReal[c-1]); got != want {
			t.Fatalf("F's coverage at %d (%s): %v, want %v", c, fev[fReal[c-1]-1].Type, got, want)
		}
	}
	fx := &rfEx{t: t, k: k, a: x.a, r: r, real: fReal}
	// fork(F, 7) lies in the copied range: it restores B0 and copies w1 and
	// w2, exactly as fork(P, 11) does.
	f7 := rfForkAt(t, k, f.id, fx.seq(7))
	p11 := x.forks[11]
	if !slices.Equal(f7.targets, p11.targets) || f7.gen["workspace"] != p11.gen["workspace"] ||
		f7.restoration["workspace"].(map[string]any)["checkpoint_ref"] != "B0" ||
		f7.restoration["workspace"].(map[string]any)["covered"] != false ||
		!slices.Equal(rfTypes(f7.evs), rfTypes(p11.evs)) {
		t.Fatalf("fork(F, 7) %v %v %v differs from fork(P, 11) %v %v %v", f7.targets, f7.gen, rfTypes(f7.evs),
			p11.targets, p11.gen, rfTypes(p11.evs))
	}
	// fork(F, 13) is uncovered (the B0 copy closed at 4): it restores B0,
	// copies all four and gets F's generation at 13 (5, from its
	// resource.initialized) plus one.
	f13 := rfForkAt(t, k, f.id, fx.seq(13))
	if !slices.Equal(f13.targets, []string{"w1", "w2", "w3", "gpt"}) || f13.gen["workspace"] != 6 ||
		!reflect.DeepEqual(f13.restoration["workspace"], map[string]any{"covered": false, "checkpoint_ref": "B0", "checkpoint_seq": 3.0}) {
		t.Fatalf("fork(F, 13): %v %v %v", f13.targets, f13.gen, f13.restoration)
	}
	r13 := rfAttach(t, k, x.a, f13.id)
	if v := r13.register(rfWS(false, 5)); v.Covered || v.CheckpointRef != "B0" || v.Generation != 6 {
		t.Fatalf("fork(F, 13) view %+v: it must take its own baseline", v)
	}
	// fork(F, 18) is covered by B1: no baseline.
	f18 := rfForkAt(t, k, f.id, fx.seq(18))
	if !slices.Equal(f18.targets, []string{"w1", "w2", "w3", "gpt"}) || f18.gen["workspace"] != 5 ||
		!reflect.DeepEqual(f18.restoration["workspace"], map[string]any{"covered": true, "checkpoint_ref": "B1", "checkpoint_seq": float64(fx.seq(18))}) {
		t.Fatalf("fork(F, 18): %v %v %v", f18.targets, f18.gen, f18.restoration)
	}
	r18 := rfAttach(t, k, x.a, f18.id)
	if v := r18.register(rfWS(false, 5)); !v.Covered || v.CheckpointRef != "B1" || v.Generation != 5 {
		t.Fatalf("fork(F, 18) view %+v", v)
	}
	// Only direct forks are listed.
	if got := rfForkIDs(t, k, x.r.id, ""); len(got) != len(x.forks) {
		t.Fatalf("P's forks %v, want %d", got, len(x.forks))
	}
	if got := rfForkIDs(t, k, f.id, ""); !slices.Equal(got, []string{f18.id, f13.id, f7.id}) {
		t.Fatalf("F's forks %v", got)
	}
}

// rfAfterF: a fork at 9 has no checkpoint to restore: create() with no ref
// and its own baseline.
func rfAfterF(x *rfEx) {
	f := x.forks[9]
	for _, ev := range f.evs {
		if ev.Type == evInit {
			rfWantPayload(x.t, "fork(F, 9) initialized", ev, `{"key":"workspace","generation":2}`)
		}
		if ev.Type == evCkpt {
			x.t.Fatalf("fork(F, 9) copied a checkpoint: %v", ev.Payload)
		}
	}
	for s := int64(5); s <= 10; s++ {
		if _, pts := rfGetPoint(x.t, x.k, x.r.id, x.seq(s)); pts[0].Reason != "no_checkpoint" || pts[0].Ref != "" {
			x.t.Fatalf("point at %d: %+v", s, pts)
		}
	}
	r := rfAttach(x.t, x.k, x.a, f.id)
	if v := r.register(rfWS(false, 2)); v.Covered || v.CheckpointRef != "" || v.Generation != 2 || v.EverySteps != 2 {
		x.t.Fatalf("fork(F, 9) view %+v", v)
	}
}

func rfForkIDs(t *testing.T, k *kt.Kernel, id, query string) []string {
	t.Helper()
	var page struct {
		Executions []map[string]any `json:"executions"`
	}
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/forks"+query, nil, nil)).JSON(t, &page)
	var out []string
	for _, e := range page.Executions {
		if e["forked_from"] != id {
			t.Fatalf("listed fork %v is not forked from %s", e["id"], id)
		}
		out = append(out, e["id"].(string))
	}
	return out
}

// ---- register, bind and the resource routes ----

// rfErr checks an error answer.
func rfErr(t *testing.T, what string, r *kt.Response, status int, code, msg string) {
	t.Helper()
	if r.Status != status || r.Code() != code || (msg != "" && !strings.Contains(string(r.Body), msg)) {
		t.Fatalf("%s: %s, want %d %s %q", what, r, status, code, msg)
	}
}

// TestResourceRegister: new, identical, conflicting, the 32 limit and every
// validation rule of §3.4.
func TestResourceRegister(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	v := r.register(`{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout": 600, "a":[1, 2]},"every_steps":5,"on_completion":true}`)
	if v.Key != "workspace" || v.DriverID != "example.e2b.v1" || string(v.Configuration) != `{"a":[1,2],"timeout":600}` ||
		v.CoverageReuse || v.EverySteps != 5 || !v.OnCompletion || v.RegisteredSeq != 5 || v.Generation != 0 ||
		string(v.Binding) != "null" || v.CheckpointRef != "" || v.Covered {
		t.Fatalf("view %+v", v)
	}
	evs := r.since(4)
	rfWantTypes(t, "register", evs, evReg)
	rfWantPayload(t, "register", evs[0], `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"a":[1,2],"timeout":600},`+
		`"coverage_reuse":false,"every_steps":5,"on_completion":true}`)
	if keys := rfStrings(k.Execution(r.id)["resource_keys"]); !slices.Equal(keys, []string{"workspace"}) {
		t.Fatalf("resource_keys %v", keys)
	}
	seq := r.lastSeq()
	// Identical (canonically equal configuration): nothing written, and
	// the stored policy wins.
	v2 := r.register(`{"key":"workspace","driver_id":"example.e2b.v1","configuration":{ "timeout" : 600, "a":[ 1,2 ]},"coverage_reuse":false,"every_steps":9}`)
	if v2.EverySteps != 5 || !v2.OnCompletion || v2.RegisteredSeq != 5 {
		t.Fatalf("identical register %+v", v2)
	}
	// Conflicts: driver_id, configuration, coverage_reuse.
	for _, c := range []struct{ what, body, requested string }{
		{"driver_id", `{"key":"workspace","driver_id":"other","configuration":{"timeout":600,"a":[1,2]}}`,
			`{"configuration":{"a":[1,2],"timeout":600},"coverage_reuse":false,"driver_id":"other"}`},
		{"configuration", `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout":601,"a":[1,2]}}`,
			`{"configuration":{"a":[1,2],"timeout":601},"coverage_reuse":false,"driver_id":"example.e2b.v1"}`},
		{"number spelling (canonical JSON keeps literals)", `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout":600.0,"a":[1,2]}}`,
			`{"configuration":{"a":[1,2],"timeout":600.0},"coverage_reuse":false,"driver_id":"example.e2b.v1"}`},
		{"no configuration", `{"key":"workspace","driver_id":"example.e2b.v1"}`,
			`{"configuration":null,"coverage_reuse":false,"driver_id":"example.e2b.v1"}`},
		{"coverage_reuse", `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout":600,"a":[1,2]},"coverage_reuse":true}`,
			`{"configuration":{"a":[1,2],"timeout":600},"coverage_reuse":true,"driver_id":"example.e2b.v1"}`},
	} {
		resp := r.call("POST", "/resources", c.body)
		rfErr(t, c.what, resp, 409, "conflict", `conflict: resource \"workspace\" is registered with another driver_id, configuration or coverage_reuse`)
		var env struct {
			Details struct{ Stored, Requested map[string]any }
		}
		resp.JSON(t, &env)
		var wantStored, wantReq map[string]any
		json.Unmarshal([]byte(`{"configuration":{"a":[1,2],"timeout":600},"coverage_reuse":false,"driver_id":"example.e2b.v1"}`), &wantStored)
		json.Unmarshal([]byte(c.requested), &wantReq)
		if !reflect.DeepEqual(env.Details.Stored, wantStored) || !reflect.DeepEqual(env.Details.Requested, wantReq) {
			t.Fatalf("%s: details %s", c.what, resp.Body)
		}
	}
	// Absent and null configuration are the same.
	r.register(`{"key":"plain","driver_id":"d"}`)
	if v := r.register(`{"key":"plain","driver_id":"d","configuration":null,"coverage_reuse":null,"every_steps":null}`); string(v.Configuration) != "null" || v.EverySteps != 0 || v.OnCompletion {
		t.Fatalf("plain view %+v", v)
	}
	if n := len(r.since(seq)); n != 1 {
		t.Fatalf("identical and refused registers wrote: %v", rfTypes(r.since(seq)))
	}
	// Validation (400, nothing written).
	seq = r.lastSeq()
	long := strings.Repeat("k", 129)
	for what, body := range map[string]string{
		"missing key":          `{"driver_id":"d"}`,
		"empty key":            `{"key":"","driver_id":"d"}`,
		"key with a space":     `{"key":"a b","driver_id":"d"}`,
		"key .":                `{"key":".","driver_id":"d"}`,
		"key ..":               `{"key":"..","driver_id":"d"}`,
		"key with a slash":     `{"key":"a/b","driver_id":"d"}`,
		"non-ASCII key":        `{"key":"é","driver_id":"d"}`,
		"129-byte key":         `{"key":"` + long + `","driver_id":"d"}`,
		"key not a string":     `{"key":5,"driver_id":"d"}`,
		"missing driver_id":    `{"key":"x"}`,
		"empty driver_id":      `{"key":"x","driver_id":""}`,
		"257-byte driver_id":   `{"key":"x","driver_id":"` + strings.Repeat("d", 257) + `"}`,
		"every_steps -1":       `{"key":"x","driver_id":"d","every_steps":-1}`,
		"every_steps 1000001":  `{"key":"x","driver_id":"d","every_steps":1000001}`,
		"every_steps 1.5":      `{"key":"x","driver_id":"d","every_steps":1.5}`,
		"every_steps string":   `{"key":"x","driver_id":"d","every_steps":"3"}`,
		"every_steps bool":     `{"key":"x","driver_id":"d","every_steps":true}`,
		"coverage_reuse 1":     `{"key":"x","driver_id":"d","coverage_reuse":1}`,
		"on_completion string": `{"key":"x","driver_id":"d","on_completion":"yes"}`,
		"configuration > 64K":  `{"key":"x","driver_id":"d","configuration":"` + strings.Repeat("c", 64*1024) + `"}`,
		"unknown field":        `{"key":"x","driver_id":"d","checkpoints":{}}`,
		"not an object":        `["x"]`,
		"empty body":           ``,
	} {
		rfErr(t, what, r.call("POST", "/resources", body), 400, "validation_error", "")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("refused registers wrote %v", rfTypes(r.since(seq)))
	}
	// The limits themselves are accepted.
	r.register(`{"key":"` + strings.Repeat("k", 128) + `","driver_id":"` + strings.Repeat("d", 256) + `","every_steps":1000000,` +
		`"configuration":"` + strings.Repeat("c", 64*1024-10) + `"}`)
	r.register(`{"key":"A-Z.a_z-09..x","driver_id":"é"}`)
	// At most 32 resources per execution.
	for i := 5; i <= 32; i++ {
		r.register(fmt.Sprintf(`{"key":"k%d","driver_id":"d"}`, i))
	}
	rfErr(t, "33rd resource", r.call("POST", "/resources", `{"key":"k33","driver_id":"d"}`), 400, "validation_error", "32")
	r.register(`{"key":"k32","driver_id":"d","every_steps":4}`) // an existing key is still answered
	keys := rfStrings(k.Execution(r.id)["resource_keys"])
	if len(keys) != 32 || keys[0] != "workspace" || keys[1] != "plain" || keys[31] != "k32" {
		t.Fatalf("resource_keys %v", keys)
	}
	rfCheckCoverage(t, k, r.id)
}

// TestResourceBind: first bind, an equal retry, a different binding, and the
// validation rules (§3.4).
func TestResourceBind(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 1))
	seq := r.lastSeq()
	r.bind("workspace", `{"sandbox_id": "i8x", "n": [1, 2.0]}`)
	evs := r.since(seq)
	rfWantTypes(t, "bind", evs, evBound)
	rfWantPayload(t, "bind", evs[0], `{"key":"workspace","binding":{"n":[1,2.0],"sandbox_id":"i8x"}}`)
	if v := r.register(rfWS(false, 1)); string(v.Binding) != `{"n":[1,2.0],"sandbox_id":"i8x"}` {
		t.Fatalf("bound view binding %s", v.Binding)
	}
	seq = r.lastSeq()
	r.bind("workspace", `{"n":[1,2.0],"sandbox_id":"i8x"}`) // canonically equal: a retry
	rfErr(t, "rebind", r.call("POST", "/resources/workspace/binding", `{"binding":{"sandbox_id":"other"}}`), 409, "conflict", "conflict: resource already bound")
	for what, body := range map[string]string{
		"null":          `{"binding":null}`,
		"absent":        `{}`,
		"over 64 KiB":   `{"binding":"` + strings.Repeat("b", 64*1024) + `"}`,
		"unknown field": `{"binding":{},"extra":1}`,
	} {
		rfErr(t, what, r.call("POST", "/resources/workspace/binding", body), 400, "validation_error", "")
	}
	rfErr(t, "unknown key", r.call("POST", "/resources/nope/binding", `{"binding":{}}`), 404, "not_found", "")
	rfErr(t, "bad key", r.call("POST", "/resources/bad!key/binding", `{"binding":{}}`), 400, "validation_error", "")
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("retry and refusals wrote %v", rfTypes(r.since(seq)))
	}
	// Any non-null JSON binds, a bare string included.
	r.register(`{"key":"other","driver_id":"d"}`)
	r.bind("other", `"just-a-string"`)
}

// TestResourceRoutesFencing: the preconditions of §3.4 on register, bind and
// publish, in order, and the dual coverage route's authorisation.
func TestResourceRoutesFencing(t *testing.T) {
	// With --require-v1-signatures (the default) both dispatch headers are required on
	// the resource routes (§6).
	k, a := rfStartKernel(t, `"lease_timeout_seconds":31`)
	other := rfNewAgent(t, k, "other", "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 1))
	routes := []struct{ what, path, body string }{
		{"register", "/resources", rfWS(false, 1)},
		{"bind", "/resources/workspace/binding", `{"binding":{"x":1}}`},
		{"publish", "/resources/checkpoints", rfCaps(rfCap("workspace", 0, "B"))},
	}
	seq := r.lastSeq()
	for _, rt := range routes {
		rfErr(t, rt.what+" without a dispatch id", r.callAs(kt.Lease{Occurrence: -1}, "POST", rt.path, rt.body), 400, "validation_error",
			"validation error: missing dispatch_id")
		rfErr(t, rt.what+" without an attempt", r.callAs(kt.Lease{DispatchID: r.lease.DispatchID, Occurrence: -1}, "POST", rt.path, rt.body),
			400, "validation_error", "")
		rfErr(t, rt.what+" on an unknown execution", r.a.Request("POST", "/v0/executions/0190aaaa-0000-7000-8000-000000000000"+rt.path,
			[]byte(rt.body), r.lease), 404, "not_found", "")
		rfErr(t, rt.what+" by another agent", other.Request("POST", r.path(rt.path), []byte(rt.body), r.lease), 403, "forbidden", "")
		rfErr(t, rt.what+" with an unknown dispatch", r.callAs(kt.Lease{DispatchID: "0190aaaa-0000-7000-8000-000000000000", Attempt: 1, Occurrence: -1},
			"POST", rt.path, rt.body), 400, "validation_error", "unknown dispatch_id")
		rfErr(t, rt.what+" with an attempt ahead", r.callAs(kt.Lease{DispatchID: r.lease.DispatchID, Attempt: 2, Occurrence: -1},
			"POST", rt.path, rt.body), 400, "validation_error", "")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("refused requests wrote %v", rfTypes(r.since(seq)))
	}
	// The dual coverage route.
	k.Must(200, a.Request("GET", r.path("/coverage"), nil, kt.Lease{Occurrence: -1}))
	k.Must(200, a.Request("GET", r.path("/coverage?at_seq=1"), nil, kt.Lease{Occurrence: -1}))
	rfErr(t, "coverage of another agent's execution", other.Request("GET", r.path("/coverage"), nil, kt.Lease{Occurrence: -1}), 403, "forbidden", "")
	rfErr(t, "coverage of an unknown execution", k.Do("GET", "/v0/executions/0190aaaa-0000-7000-8000-000000000000/coverage", nil, nil), 404, "not_found", "")
	rfErr(t, "coverage at_seq=abc", k.Do("GET", r.path("/coverage?at_seq=abc"), nil, nil), 400, "validation_error", "")
	rfErr(t, "coverage at_seq=-1", k.Do("GET", r.path("/coverage?at_seq=-1"), nil, nil), 400, "validation_error", "")
	rfErr(t, "forks of another agent's execution", other.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}), 403, "forbidden", "")
	k.Must(200, a.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}))

	// A reclaimed attempt is superseded on every resource route.
	old := r.lease
	k.AdvanceClock(32 * time.Second)
	r2 := rfAttach(t, k, a, r.id)
	if r2.lease.Attempt != 2 {
		t.Fatalf("redelivery %+v", r2.lease)
	}
	seq = r.lastSeq()
	for _, rt := range routes {
		rfErr(t, rt.what+" superseded", r.callAs(old, "POST", rt.path, rt.body), 409, "lease_superseded", "lease superseded")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("superseded requests wrote %v", rfTypes(r.since(seq)))
	}
	r2.bind("workspace", `{"x":1}`)
	// Terminal wins over everything after the existence checks, superseded
	// included.
	r2.finish()
	for _, rt := range routes {
		rfErr(t, rt.what+" terminal", r.callAs(r2.lease, "POST", rt.path, rt.body), 409, "execution_terminal", "")
		rfErr(t, rt.what+" terminal, superseded", r.callAs(old, "POST", rt.path, rt.body), 409, "execution_terminal", "")
	}
	rfErr(t, "terminal, another agent", other.Request("POST", r.path("/resources"), []byte(rfWS(false, 1)), r2.lease), 403, "forbidden", "")
}

// ---- captures ----

// TestCaptureRefusals: every refusal token of §3.4, in rule order, on the
// publish route and with step outcomes; writers, including an orphan of a
// reclaimed attempt that stops being one; a late capture of a re-run
// orphan's first attempt.
func TestCaptureRefusals(t *testing.T) {
	k, a := rfStartKernel(t, `"lease_timeout_seconds":31`)
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 1))
	r.register(`{"key":"ro","driver_id":"d","coverage_reuse":true,"every_steps":1}`)
	// Rule order within one list.
	seq := r.lastSeq()
	r.publish(`{"captures":[` + strings.Join([]string{
		rfCap("nope", 0, "x"),
		rfCap("workspace", 0, ""),
		`{"key":"workspace","generation":0,"checkpoint_ref":5}`,
		`{"key":"workspace","generation":0,"checkpoint_ref":null}`,
		`{"key":"workspace","generation":0}`,
		rfCap("workspace", 0, strings.Repeat("r", 1025)),
		rfCap("workspace", 7, "ok"),
		rfCap("nope", 0, "y"),
	}, ",") + `]}`)
	want := []string{"nope@0:unknown_resource", "workspace@0:missing_checkpoint_ref", "workspace@0:missing_checkpoint_ref",
		"workspace@0:missing_checkpoint_ref", "workspace@0:missing_checkpoint_ref", "workspace@0:checkpoint_ref_too_long",
		"workspace@7:duplicate_capture", "nope@0:unknown_resource"}
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, want) || len(r.since(seq)) != len(want) {
		t.Fatalf("refusals %v, want %v", got, want)
	}
	// A stale first entry is stale; a later one of the same key is a
	// duplicate whatever its generation.
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 1, "stale"), rfCap("workspace", 0, "dup")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"workspace@1:stale_generation", "workspace@0:duplicate_capture"}) {
		t.Fatalf("refusals %v", got)
	}
	// A ref of exactly 1,024 bytes is accepted.
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 0, strings.Repeat("r", 1024)), rfCap("ro", 0, "ro0")))
	rfWantTypes(t, "1 KiB ref", r.since(seq), evCkpt, evCkpt)
	if c := rfNum(r.since(seq)[1].Payload["covered_seq"]); c != seq+1 {
		t.Fatalf("both captures of one publish cover from its first event: %d", c)
	}

	// Writers. T1 (tool, no resources) writes workspace (no reuse), not ro.
	t1 := r.live("tool_call", "t1", "", nil, ent("workspace", 1, false))
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 1, "w1"), rfCap("ro", 0, "ro1")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"workspace@1:writers_active"}) {
		t.Fatalf("writers: %v", got)
	}
	rfWantTypes(t, "writers", r.since(seq), evCkptFail, evCkpt)
	// With its own outcome T1 is no longer a writer.
	seq = r.lastSeq()
	r.done(t1, `"t1"`, `,"captures":[`+rfCap("workspace", 1, "w1b")+`]`)
	rfWantTypes(t, "capture with outcome", r.since(seq), evSucceeded, evCkpt)
	if c := rfNum(r.since(seq)[1].Payload["covered_seq"]); c != seq+1 {
		t.Fatalf("capture with an outcome covers from %d, want the outcome %d", c, seq+1)
	}
	// T2 (local, declares ro) and an LLM call L.
	t2 := r.live("local", "t2", "", []string{"ro"}, ent("ro", 1, true), ent("workspace", 2, false))
	l := r.live("llm_call", "l", "", nil, ent("workspace", 3, false))
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("ro", 1, "r"), rfCap("workspace", 3, "w")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"ro@1:writers_active", "workspace@3:writers_active"}) {
		t.Fatalf("writers: %v", got)
	}
	// An LLM step is never a writer.
	seq = r.lastSeq()
	r.done(t2, `"t2"`, `,"captures":[`+rfCap("ro", 1, "r2")+`,`+rfCap("workspace", 3, "w2")+`]`)
	rfWantTypes(t, "captures with T2's outcome", r.since(seq), evSucceeded, evCkpt, evCkpt)
	r.done(l, `"l"`, "")

	// An orphan of a reclaimed attempt is not a writer; its re-run is.
	t3 := r.live("tool_call", "t3", "", ws, ent("workspace", 4, true))
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 4, "w4")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"workspace@4:writers_active"}) {
		t.Fatalf("before the reclaim: %v", got)
	}
	k.AdvanceClock(32 * time.Second)
	r2 := rfAttach(t, k, a, r.id)
	seq = r2.lastSeq()
	r2.publish(rfCaps(rfCap("workspace", 4, "w4-after-reclaim")))
	rfWantTypes(t, "orphan is not a writer", r2.since(seq), evCkpt)
	// The re-run: a new step.executing with retry, a higher generation, and
	// the counter counts it (due again at every_steps 1).
	seq = r2.lastSeq()
	d := r2.submit(rfStepBody("tool_call", "t3", "", ws...))
	if d.Decision != "proceed" || d.StepID != t3 || !slices.Equal(d.Resources, []rfEntry{ent("workspace", 5, true)}) {
		t.Fatalf("re-run: %s", d.raw)
	}
	evs := r2.since(seq)
	rfWantTypes(t, "re-run", evs, evExecuting)
	rfWantPayload(t, "re-run", evs[0], fmt.Sprintf(`{"step_id":%q,"step_type":"tool_call","target":"t3","resources":["workspace"],`+
		`"generations":{"workspace":5},"retry":true}`, t3))
	seq = r2.lastSeq()
	r2.publish(rfCaps(rfCap("workspace", 5, "w5")))
	if got := rfFailures(t, r2.since(seq)); !slices.Equal(got, []string{"workspace@5:writers_active"}) {
		t.Fatalf("re-run writer: %v", got)
	}
	// The first attempt reports its outcome late (recorded: the effect
	// ran), with a capture of its own generation: stale.
	seq = r2.lastSeq()
	if dd := r.doneAs(r.lease, t3, "complete", `"t3 first"`, `,"captures":[`+rfCap("workspace", 4, "late")+`]`); dd.Decision != "recorded" {
		t.Fatalf("late outcome: %s", dd.raw)
	}
	evs = r2.since(seq)
	rfWantTypes(t, "late outcome", evs, evSucceeded, evCkptFail)
	rfWantPayload(t, "late capture", evs[1], `{"key":"workspace","generation":4,"error":"stale_generation"}`)
	rfCheckCoverage(t, k, r.id)
}

// TestCaptureFailures: capture_failures on publish and outcomes, the 4 KiB
// cut, the counter rules (failures and refusals leave it, acceptance resets
// it), captures of outcomes that are not recorded, and bad shapes.
func TestCaptureFailures(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 2))
	r.publish(rfCaps(rfCap("workspace", 0, "B0")))
	w1 := r.live("tool_call", "w1", "", ws, ent("workspace", 1, false))
	r.done(w1, `"1"`, "")
	w2 := r.live("tool_call", "w2", "", ws, ent("workspace", 2, true))
	long := strings.Repeat("é", 3000) + "!" // 6,001 bytes
	seq := r.lastSeq()
	r.done(w2, `"2"`, `,"capture_failures":[`+rfCapFail("workspace", 2, long)+`,{"key":"ghost","generation":9,"error":null},{"key":"g2","generation":0}]`)
	evs := r.since(seq)
	rfWantTypes(t, "failures", evs, evSucceeded, evCkptFail, evCkptFail, evCkptFail)
	if e := evs[1].Payload["error"].(string); e != strings.Repeat("é", 2048) {
		t.Fatalf("error cut to %d bytes, want 4096 at a character boundary", len(e))
	}
	rfWantPayload(t, "null error", evs[2], `{"key":"ghost","generation":9,"error":""}`)
	rfWantPayload(t, "absent error", evs[3], `{"key":"g2","generation":0,"error":""}`)
	// The counter stayed at 2. An LLM call raises the generation but is
	// never due (only declared keys are); w3 is due; its capture is
	// refused (stale), so w4 is due again; w4's is accepted, so w5 is not
	// due.
	l := r.live("llm_call", "l", "", nil, ent("workspace", 3, false))
	r.done(l, `"l"`, "")
	w3 := r.live("tool_call", "w3", "", ws, ent("workspace", 4, true))
	r.done(w3, `"3"`, `,"captures":[`+rfCap("workspace", 2, "stale")+`]`)
	w4 := r.live("tool_call", "w4", "", ws, ent("workspace", 5, true))
	seq = r.lastSeq()
	d := r.doneAs(r.lease, w4, "fail", `{"message":"boom"}`, `,"captures":[`+rfCap("workspace", 5, "P4")+`]`)
	if d.Decision != "recorded" {
		t.Fatalf("fail: %s", d.raw)
	}
	rfWantTypes(t, "capture with a failure", r.since(seq), "step.failed", evCkpt)
	w5 := r.live("tool_call", "w5", "", ws, ent("workspace", 6, false))
	// Bad shapes: 400, and the outcome is not recorded.
	seq = r.lastSeq()
	for what, extra := range map[string]string{
		"captures not a list":    `,"captures":{}`,
		"entry not an object":    `,"captures":["x"]`,
		"missing key":            `,"captures":[{"generation":1,"checkpoint_ref":"x"}]`,
		"key not a string":       `,"captures":[{"key":1,"generation":1,"checkpoint_ref":"x"}]`,
		"missing generation":     `,"captures":[{"key":"workspace","checkpoint_ref":"x"}]`,
		"negative generation":    `,"captures":[{"key":"workspace","generation":-1,"checkpoint_ref":"x"}]`,
		"fractional generation":  `,"captures":[{"key":"workspace","generation":1.5,"checkpoint_ref":"x"}]`,
		"string generation":      `,"captures":[{"key":"workspace","generation":"1","checkpoint_ref":"x"}]`,
		"unknown entry field":    `,"captures":[{"key":"workspace","generation":1,"checkpoint_ref":"x","kind":"y"}]`,
		"error in a capture":     `,"captures":[{"key":"workspace","generation":1,"error":"x"}]`,
		"ref in a failure":       `,"capture_failures":[{"key":"workspace","generation":1,"checkpoint_ref":"x"}]`,
		"error not a string":     `,"capture_failures":[{"key":"workspace","generation":1,"error":5}]`,
		"33 captures":            `,"captures":[` + strings.TrimSuffix(strings.Repeat(rfCap("workspace", 5, "x")+",", 33), ",") + `]`,
		"33 capture failures":    `,"capture_failures":[` + strings.TrimSuffix(strings.Repeat(rfCapFail("workspace", 5, "x")+",", 33), ",") + `]`,
		"failures not a list":    `,"capture_failures":"x"`,
		"unknown outcome member": `,"checkpoints":[]`,
	} {
		rfErr(t, "complete: "+what, r.call("POST", "/steps/"+w5+"/complete", `{"result":1`+extra+`}`), 400, "validation_error", "")
		rfErr(t, "publish: "+what, r.call("POST", "/resources/checkpoints", `{`+strings.TrimPrefix(extra, ",")+`}`), 400, "validation_error", "")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("bad shapes wrote %v", rfTypes(r.since(seq)))
	}
	// 32 entries are accepted (one per list is a duplicate after the first).
	r.publish(`{"captures":[` + strings.TrimSuffix(strings.Repeat(rfCap("nope", 0, "x")+",", 32), ",") + `]}`)
	// Captures travel only with a recorded outcome.
	r.done(w5, `"5"`, "")
	seq = r.lastSeq()
	if d := r.doneAs(r.lease, w5, "complete", `"again"`, `,"captures":[`+rfCap("workspace", 5, "C")+`],"capture_failures":[`+rfCapFail("workspace", 5, "x")+`]`); d.Decision != "replay" {
		t.Fatalf("second complete: %s", d.raw)
	}
	if d := r.doneAs(r.lease, w4, "fail", `"again"`, `,"captures":[`+rfCap("workspace", 5, "C")+`]`); d.Decision != "replay" {
		t.Fatalf("second fail: %s", d.raw)
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("captures of replayed outcomes wrote %v", rfTypes(r.since(seq)))
	}
	w6 := r.live("tool_call", "w6", "", ws, ent("workspace", 7, true))
	r.finish()
	seq = r.lastSeq()
	if d := r.doneAs(r.lease, w6, "complete", `"late"`, `,"captures":[`+rfCap("workspace", 6, "C")+`]`); d.Decision != "execution_terminal" {
		t.Fatalf("complete on a terminal execution: %s", d.raw)
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("captures on a terminal execution wrote %v", rfTypes(r.since(seq)))
	}
	rfCheckCoverage(t, k, r.id)
}

// TestSubmitResources: the submit body's resources (§10.1 hooks), the step's
// resources, and the same-attempt retry answering the stored entries.
func TestSubmitResources(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 2))
	r.register(`{"key":"ro","driver_id":"d","coverage_reuse":true}`)
	seq := r.lastSeq()
	rfErr(t, "unregistered key", r.call("POST", "/steps", rfStepBody("tool_call", "x", "", "nope")), 400, "validation_error",
		`validation error: unknown resource key \"nope\"`)
	rfErr(t, "llm_call with resources", r.call("POST", "/steps", rfStepBody("llm_call", "x", "", "workspace")), 400, "validation_error", "")
	rfErr(t, "bad key", r.call("POST", "/steps", rfStepBody("tool_call", "x", "", "a b")), 400, "validation_error", "")
	rfErr(t, "resources not strings", r.call("POST", "/steps", `{"kind":"tool_call","target":"x","resources":[1]}`), 400, "validation_error", "")
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("refused submits wrote %v", rfTypes(r.since(seq)))
	}
	// [] is allowed on every kind; duplicates are dropped.
	l := r.live("llm_call", "l", "", []string{}, ent("workspace", 1, false))
	r.done(l, "1", "")
	occ := func(n int64) kt.Lease { x := r.lease; x.Occurrence = n; return x }
	x := r.submitAs(occ(0), rfStepBody("tool_call", "x", "", "ro", "workspace", "ro"))
	want := []rfEntry{ent("ro", 1, false), ent("workspace", 2, false)}
	if x.Decision != "proceed" || !slices.Equal(x.Resources, want) {
		t.Fatalf("x: %s", x.raw)
	}
	var st rfStep
	k.Must(200, k.Do("GET", r.path("/steps/"+x.StepID), nil, nil)).JSON(t, &st)
	if string(st["resources"]) != `["ro","workspace"]` {
		t.Fatalf("step resources %s", st["resources"])
	}
	// Y raises the counter to 2 while X is executing.
	y := r.submitAs(occ(0), rfStepBody("local", "y", "", "workspace"))
	if !slices.Equal(y.Resources, []rfEntry{ent("workspace", 3, true)}) {
		t.Fatalf("y: %s", y.raw)
	}
	// X's proceed was "lost": the same attempt asks again. The answer is
	// X's own start (generations 1 and 2) with due read now (true).
	seq = r.lastSeq()
	again := r.submitAs(occ(0), rfStepBody("tool_call", "x", "", "workspace"))
	if again.Decision != "proceed" || again.StepID != x.StepID || !slices.Equal(again.Resources, []rfEntry{ent("ro", 1, false), ent("workspace", 2, true)}) {
		t.Fatalf("same-attempt retry: %s", again.raw)
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("same-attempt retry wrote %v", rfTypes(r.since(seq)))
	}
	// The stored declaration counts, not the retry's.
	k.Must(200, k.Do("GET", r.path("/steps/"+x.StepID), nil, nil)).JSON(t, &st)
	if string(st["resources"]) != `["ro","workspace"]` {
		t.Fatalf("step resources after the retry %s", st["resources"])
	}
	// A step that raised nothing answers [] again.
	r.done(y.StepID, "1", "")
	r.done(x.StepID, "1", "")
	rfCheckCoverage(t, k, r.id)
}

// ---- forks ----

// TestForkCopies: which steps a fork copies (§5.2), their ids and shared
// bodies returned verbatim, the fork's first dispatch replaying them, and a
// step that waited for approval asking again.
func TestForkCopies(t *testing.T) {
	k, a := rfStartKernel(t, "")
	gvMustPolicy(t, k, "coder", "default_action: allow\nrules:\n"+
		"  - id: no-rm\n    when: {target: rm}\n    then: {decision: deny, reason: \"never rm\"}\n"+
		"  - id: ask\n    priority: 1\n    when: {target: \"deploy*\"}\n    then: {decision: require_approval}\n")
	r := rfBegin(t, k, a, `{"task" : "copies"}`)
	r.register(rfWS(false, 1))
	search := r.live("tool_call", "search", ` { "q" :  "x" } `, nil, ent("workspace", 1, false))
	r.done(search, ` {"hits" : [1, 2.50]} `, "")
	boom := r.live("tool_call", "boom", `[1,  2]`, nil, ent("workspace", 2, false))
	if d := r.doneAs(r.lease, boom, "fail", `{"message" : "kaput"}`, ""); d.Decision != "recorded" {
		t.Fatal(d.raw)
	}
	rm := r.submit(rfStepBody("tool_call", "rm", `{"p":"/"}`))
	if rm.Decision != "denied" || rm.Reason != "never rm" || rm.RuleID != "no-rm" {
		t.Fatalf("rm: %s", rm.raw)
	}
	now := r.live("local", "now", "", ws, ent("workspace", 3, true))
	r.done(now, `"2026-12-02"`, `,"captures":[`+rfCap("workspace", 3, "C3")+`]`)
	slow := r.live("tool_call", "slow", "", nil, ent("workspace", 4, false))
	// deploy0 waits for approval, is granted, resumes (a live start) and
	// succeeds.
	d0 := r.submit(rfStepBody("tool_call", "deploy0", `{"v":0}`))
	if d0.Decision != "blocked" {
		t.Fatalf("deploy0: %s", d0.raw)
	}
	k.Must(204, gvDecide(k, d0.ApprovalID, "grant", `{"decided_by":"ops"}`))
	r1 := rfAttach(t, k, a, r.id)
	if id := r1.live("tool_call", "deploy0", `{"v":0}`, nil, ent("workspace", 5, false)); id != d0.StepID {
		t.Fatalf("resumed deploy0 is %s, want %s", id, d0.StepID)
	}
	r1.done(d0.StepID, `"deployed"`, "")
	d1 := r1.submit(rfStepBody("tool_call", "deploy1", ""))
	if d1.Decision != "blocked" {
		t.Fatalf("deploy1: %s", d1.raw)
	}
	// A human denial: the step is denied with the rationale as its reason.
	k.Must(204, gvDecide(k, d1.ApprovalID, "deny", `{"decided_by":"ops","rationale":"no"}`))
	r2 := rfAttach(t, k, a, r.id)
	if d := r2.submit(rfStepBody("tool_call", "deploy1", "")); d.Decision != "denied" {
		t.Fatalf("deploy1 after deny: %s", d.raw)
	}
	d2 := r2.submit(rfStepBody("tool_call", "deploy2", ""))
	if d2.Decision != "blocked" {
		t.Fatalf("deploy2: %s", d2.raw)
	}
	// Fork while blocked: deploy2 awaits approval and slow is executing;
	// neither is copied. Forks at every seq follow the model.
	last := r.lastSeq()
	var f *rfFork
	for s := int64(1); s <= last; s++ {
		f = rfForkAt(t, k, r.id, s)
	}
	if !slices.Equal(f.targets, []string{"search", "boom", "rm", "now", "deploy0", "deploy1"}) {
		t.Fatalf("copied %v", f.targets)
	}
	var allowed []string
	for _, ev := range f.evs {
		if ev.Type == evAllowed && ev.Payload["approval_id"] != nil {
			allowed = append(allowed, ev.Payload["approval_id"].(string))
		}
	}
	if !slices.Equal(allowed, []string{d0.ApprovalID}) {
		t.Fatalf("copied step.allowed approval ids %v, want the source's %s", allowed, d0.ApprovalID)
	}
	// The fork's first dispatch: same ids, replays with the stored bodies
	// verbatim, denials replay denied, the rest runs live and asks again;
	// no approval of the source is copied.
	fr := rfAttach(t, k, a, f.id)
	if v := fr.register(rfWS(false, 1)); v.Covered || v.CheckpointRef != "C3" || v.Generation != 6 {
		t.Fatalf("fork view %+v", v)
	}
	body := func(d rfDecision) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		json.Unmarshal(d.raw, &m)
		return m
	}
	if d := fr.submit(rfStepBody("tool_call", "search", ` { "q" :  "x" } `)); d.Decision != "replay" || d.StepID != f.stepIDs[search] ||
		string(body(d)["result"]) != `{"hits" : [1, 2.50]}` {
		t.Fatalf("search replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "boom", `[1,  2]`)); d.Decision != "replay" || string(body(d)["error"]) != `{"message" : "kaput"}` {
		t.Fatalf("boom replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "rm", `{"p":"/"}`)); d.Decision != "denied" || d.Reason != "never rm" || d.RuleID != "no-rm" ||
		d.StepID != f.stepIDs[rm.StepID] {
		t.Fatalf("rm replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("local", "now", "", "workspace")); d.Decision != "replay" || d.StepID != f.stepIDs[now] {
		t.Fatalf("now replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "deploy0", `{"v":0}`)); d.Decision != "replay" || string(d.Result) != `"deployed"` {
		t.Fatalf("deploy0 replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "deploy1", "")); d.Decision != "denied" || d.Reason != "no" {
		t.Fatalf("deploy1 replay: %s", d.raw)
	}
	if d := fr.submit(rfStepBody("tool_call", "slow", "")); d.Decision != "proceed" || d.StepID == slow {
		t.Fatalf("slow in the fork: %s", d.raw)
	}
	fd2 := fr.submit(rfStepBody("tool_call", "deploy2", ""))
	if fd2.Decision != "blocked" || fd2.ApprovalID == d2.ApprovalID {
		t.Fatalf("deploy2 in the fork asks again: %s", fd2.raw)
	}
	if got := gvListApprovals(t, k, "?execution_id="+f.id); !slices.Equal(got, []string{fd2.ApprovalID}) {
		t.Fatalf("the fork's approvals %v, want only its own %s", got, fd2.ApprovalID)
	}
	// GET of a copied step shows the shared bodies verbatim.
	var st rfStep
	k.Must(200, k.Do("GET", "/v0/executions/"+f.id+"/steps/"+f.stepIDs[search], nil, nil)).JSON(t, &st)
	if string(st["args"]) != `{ "q" :  "x" }` || string(st["result"]) != `{"hits" : [1, 2.50]}` || st.str("execution_id") != f.id {
		t.Fatalf("copied step %v", st)
	}
	k.Must(200, k.Do("GET", "/v0/executions/"+f.id+"/steps/"+f.stepIDs[boom], nil, nil)).JSON(t, &st)
	if string(st["args"]) != `[1,  2]` || string(st["error"]) != `{"message" : "kaput"}` {
		t.Fatalf("copied step %v", st)
	}
	// Cancel the source: deploy2 is denied by the clean-up and slow is
	// cancelled; forks after that still copy neither.
	k.Must(204, k.Do("POST", r.path("/cancel"), nil, nil))
	last = r.lastSeq()
	fc := rfForkAt(t, k, r.id, last)
	if !slices.Equal(fc.targets, []string{"search", "boom", "rm", "now", "deploy0", "deploy1"}) {
		t.Fatalf("copied after cancel %v", fc.targets)
	}
	fcr := rfAttach(t, k, a, fc.id)
	if d := fcr.submit(rfStepBody("tool_call", "deploy2", "")); d.Decision != "blocked" {
		t.Fatalf("deploy2 in the fork of the cancelled source: %s", d.raw)
	}
}

// TestForkRetention: the source's retention keeps the fork's shared bodies
// readable, and a fork of that fork survives both (§5.2, PROTOCOL §7.9).
func TestForkRetention(t *testing.T) {
	k, a := rfStartKernel(t, `"lease_timeout_seconds":86400`, "--retention", "1h", "--cleanup-interval", "1m",
		"--dispatch-max-attempts", "1000")
	p := rfBegin(t, k, a, "1")
	s1 := p.live("tool_call", "s1", ` {"a" : 1} `, nil)
	p.done(s1, ` [ "r1" ,1.0] `, "")
	s2 := p.live("tool_call", "s2", `"x"`, nil)
	if d := p.doneAs(p.lease, s2, "fail", ` {"message":"e" } `, ""); d.Decision != "recorded" {
		t.Fatal(d.raw)
	}
	p.finish()
	bodies := func(id string) []string {
		var out []string
		for _, st := range rfSteps(t, k, id) {
			out = append(out, string(st["args"])+"|"+string(st["result"])+string(st["error"]))
		}
		return out
	}
	want := []string{`{"a" : 1}|[ "r1" ,1.0]`, `"x"|{"message":"e" }`}
	if got := bodies(p.id); !slices.Equal(got, want) {
		t.Fatalf("source bodies %q", got)
	}
	k.AdvanceClock(40 * time.Minute)
	f := rfForkAt(t, k, p.id, p.lastSeq())
	fr := rfAttach(t, k, a, f.id)
	g := rfForkAt(t, k, f.id, 4+2*4)
	fr.finish()
	k.AdvanceClock(30 * time.Minute) // p is 70 minutes old, f 30
	gone := func(id string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for k.Do("GET", "/v0/executions/"+id, nil, nil).Status != 404 {
			if time.Now().After(deadline) {
				t.Fatalf("execution %s was not deleted", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	gone(p.id)
	rfErr(t, "source step", k.Do("GET", "/v0/executions/"+p.id+"/steps/"+s1, nil, nil), 404, "not_found", "")
	if got := bodies(f.id); !slices.Equal(got, want) {
		t.Fatalf("fork bodies after the source's deletion %q", got)
	}
	k.AdvanceClock(time.Hour)
	gone(f.id)
	if got := bodies(g.id); !slices.Equal(got, want) {
		t.Fatalf("fork-of-fork bodies after both deletions %q", got)
	}
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+g.id+"/steps/"+g.stepIDs[f.stepIDs[s1]], nil, nil))
	if !bytes.Contains(resp.Body, []byte(`{"a" : 1}`)) || !bytes.Contains(resp.Body, []byte(`[ "r1" ,1.0]`)) {
		t.Fatalf("fork-of-fork step %s", resp.Body)
	}
	// The fork of the fork replays them.
	gr := rfAttach(t, k, a, g.id)
	if d := gr.submit(rfStepBody("tool_call", "s1", `{"a":1}`)); d.Decision != "replay" || string(d.Result) != `[ "r1" ,1.0]` {
		t.Fatalf("replay in the fork of the fork: %s", d.raw)
	}
}

// TestForkErrors: §5.5 and the Idempotency-Key of a fork.
func TestForkErrors(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Token: "tok-" + strings.Repeat("x", 20)})
	a := rfNewAgent(t, k, "coder", "")
	r := rfBegin(t, k, a, "1")
	last := r.lastSeq()
	path := r.path("/fork")
	for what, body := range map[string]string{
		"at_seq 0":          `{"at_seq":0}`,
		"at_seq negative":   `{"at_seq":-3}`,
		"at_seq past last":  fmt.Sprintf(`{"at_seq":%d}`, last+1),
		"at_seq missing":    `{}`,
		"at_seq null":       `{"at_seq":null}`,
		"at_seq string":     `{"at_seq":"3"}`,
		"at_seq fraction":   `{"at_seq":1.5}`,
		"session":           `{"at_seq":1,"session":"s1"}`,
		"session object":    `{"at_seq":1,"session":{}}`,
		"policy_bundle":     `{"at_seq":1,"policy_bundle":"default_action: deny"}`,
		"unknown field":     `{"at_seq":1,"fork_seq":1}`,
		"not an object":     `[1]`,
		"huge at_seq":       `{"at_seq":99999999999999999999}`,
		"session not empty": `{"at_seq":1,"session":" "}`,
	} {
		msg := ""
		if strings.HasPrefix(what, "at_seq") && what != "at_seq missing" && what != "at_seq null" && what != "at_seq string" && what != "at_seq fraction" {
			msg = fmt.Sprintf("at_seq must be between 1 and %d", last)
		}
		rfErr(t, what, k.Do("POST", path, []byte(body), nil), 400, "validation_error", msg)
	}
	// Absent, null and "" session and policy_bundle are accepted.
	k.Must(201, k.Do("POST", path, []byte(`{"at_seq":1,"session":null,"policy_bundle":""}`), nil))
	k.Must(201, k.Do("POST", path, []byte(`{"at_seq":1,"session":""}`), nil))
	rfErr(t, "unknown source", k.Do("POST", "/v0/executions/0190aaaa-0000-7000-8000-000000000000/fork", []byte(`{"at_seq":1}`), nil), 404, "not_found", "")
	rfErr(t, "bad source id", k.Do("POST", "/v0/executions/nope/fork", []byte(`{"at_seq":1}`), nil), 400, "validation_error", "")
	// No bearer, a wrong one, and an agent signature are 401.
	req, _ := http.NewRequest("POST", k.URL+path, strings.NewReader(`{"at_seq":1}`))
	resp, err := k.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("fork without a bearer: %d", resp.StatusCode)
	}
	if resp := k.Do("POST", path, []byte(`{"at_seq":1}`), map[string]string{"Authorization": "Bearer wrong"}); resp.Status != 401 {
		t.Fatalf("fork with a wrong bearer: %s", resp)
	}
	// Idempotency-Key: same body → the same fork (201); different body →
	// 409; the key is scoped to the source.
	key := map[string]string{"Idempotency-Key": "fork-key-1"}
	f1 := k.Must(201, k.Do("POST", path, []byte(`{"at_seq":2}`), key)).Map(t)
	f2 := k.Must(201, k.Do("POST", path, []byte(` { "at_seq" : 2 } `), key)).Map(t)
	if f1["id"] != f2["id"] || f1["fork_seq"] != 2.0 || f1["idempotency_key"] != "fork-key-1" || f2["idempotency_key"] != "fork-key-1" {
		t.Fatalf("idempotent fork: %v then %v", f1["id"], f2["id"])
	}
	rfErr(t, "key reused with another body", k.Do("POST", path, []byte(`{"at_seq":3}`), key), 409, "conflict",
		"conflict: idempotency key reused with a different body")
	rfErr(t, "bad key", k.Do("POST", path, []byte(`{"at_seq":3}`), map[string]string{"Idempotency-Key": "a b"}), 400, "validation_error", "")
	other := rfBegin(t, k, a, "2")
	f3 := k.Must(201, k.Do("POST", other.path("/fork"), []byte(`{"at_seq":2}`), key)).Map(t)
	if f3["id"] == f1["id"] || f3["forked_from"] != other.id {
		t.Fatalf("the key is scoped to the source: %v", f3)
	}
	if n := len(rfForkIDs(t, k, r.id, "")); n != 3 {
		t.Fatalf("forks of the source: %d, want 3", n)
	}
	// The source's agent is gone: 409.
	g := rfNewAgent(t, k, "gone", "")
	gr := rfBegin(t, k, g, "1")
	gr.finish()
	k.Must(204, k.Do("DELETE", "/v0/agents/gone", nil, nil))
	rfErr(t, "agent gone", k.Do("POST", gr.path("/fork"), []byte(`{"at_seq":1}`), nil), 409, "conflict", `conflict: agent \"gone\" is not registered`)
}

// TestForksList: direct forks only, newest first, paged like the execution
// list (§5.3).
func TestForksList(t *testing.T) {
	k, a := rfStartKernel(t, "")
	other := rfNewAgent(t, k, "other", "")
	r := rfBegin(t, k, a, "1")
	r.finish()
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, k.Must(201, k.Do("POST", r.path("/fork"), []byte(`{"at_seq":2}`), nil)).Map(t)["id"].(string))
	}
	g := k.Must(201, k.Do("POST", "/v0/executions/"+ids[0]+"/fork", []byte(`{"at_seq":1}`), nil)).Map(t)["id"].(string)
	var page struct {
		Executions []map[string]any `json:"executions"`
		NextCursor *string          `json:"next_cursor"`
	}
	k.Must(200, k.Do("GET", r.path("/forks?limit=2"), nil, nil)).JSON(t, &page)
	if len(page.Executions) != 2 || page.Executions[0]["id"] != ids[2] || page.Executions[1]["id"] != ids[1] ||
		page.NextCursor == nil || *page.NextCursor != ids[1] {
		t.Fatalf("first page %+v", page)
	}
	page.NextCursor = nil
	k.Must(200, k.Do("GET", r.path("/forks?limit=2&cursor="+ids[1]), nil, nil)).JSON(t, &page)
	if len(page.Executions) != 1 || page.Executions[0]["id"] != ids[0] || page.NextCursor != nil {
		t.Fatalf("second page %+v", page)
	}
	if got := rfForkIDs(t, k, r.id, ""); !slices.Equal(got, []string{ids[2], ids[1], ids[0]}) {
		t.Fatalf("all forks %v", got)
	}
	if got := rfForkIDs(t, k, ids[0], ""); !slices.Equal(got, []string{g}) {
		t.Fatalf("forks of a fork %v", got)
	}
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+g+"/forks", nil, nil))
	if !bytes.Contains(resp.Body, []byte(`"executions":[]`)) || bytes.Contains(resp.Body, []byte("next_cursor")) {
		t.Fatalf("no forks: %s", resp.Body)
	}
	// Owner's HMAC reads it; another agent cannot.
	k.Must(200, a.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}))
	rfErr(t, "another agent", other.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}), 403, "forbidden", "")
	rfErr(t, "unknown", k.Do("GET", "/v0/executions/0190aaaa-0000-7000-8000-000000000000/forks", nil, nil), 404, "not_found", "")
	rfErr(t, "bad cursor", k.Do("GET", r.path("/forks?cursor=x"), nil, nil), 400, "validation_error", "")
	rfErr(t, "negative limit", k.Do("GET", r.path("/forks?limit=-1"), nil, nil), 400, "validation_error", "")
	// The source's own log is untouched by its forks.
	rfWantTypes(t, "source", k.Events(r.id), evCreated, evStarted, evQueued, evAcked, evCompleted)
}
