package blackbox

import (
	"encoding/json"
	"fmt"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestResourcesExampleA replays Example A of RESOURCES-AND-FORKS §4.3 over
// HTTP and checks the ranges and a fork's log.
func TestResourcesExampleA(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("coder", "")
	id := k.CreateExecution("coder", `{"task":"x"}`)
	l := kt.LeaseOf(a.NextWebhook())
	ex := "/v0/executions/" + id
	// The ack is recorded after the webhook returns; wait for it so that the
	// log numbers as in the example.
	for len(k.Events(id)) < 4 {
	}
	reg := a.Request("POST", ex+"/resources", []byte(`{"key":"workspace","driver_id":"local.v1","configuration":{"b":1, "a":2},"every_steps":1,"on_completion":true}`), l)
	k.Must(200, reg)
	t.Log(string(reg.Body))
	k.Must(204, a.Request("POST", ex+"/resources/workspace/binding", []byte(`{"binding":{"dir":"/tmp/w"}}`), l))
	k.Must(204, a.Request("POST", ex+"/resources/checkpoints", []byte(`{"captures":[{"key":"workspace","generation":0,"checkpoint_ref":"B0"}]}`), l))
	llm := func(n int) {
		d := a.Submit(id, l, fmt.Sprintf(`{"kind":"llm_call","target":"gpt","args":{"n":%d}}`, n))
		a.Complete(id, d.StepID, l, `"ok"`)
	}
	llm(1)
	w := a.Submit(id, l, `{"kind":"tool_call","target":"write_file","args":{"p":"a"},"resources":["workspace"]}`)
	if b, _ := json.Marshal(w.Resources); string(b) != `[{"due":true,"generation":2,"key":"workspace"}]` {
		t.Fatalf("proceed resources %s", b)
	}
	r := a.Request("POST", ex+"/steps/"+w.StepID+"/complete", []byte(`{"result":"wrote a","captures":[{"key":"workspace","generation":2,"checkpoint_ref":"C1"}]}`), l)
	k.Must(200, r)
	llm(2)
	rd := a.Submit(id, l, `{"kind":"tool_call","target":"read_file","args":{"p":"a"}}`)
	a.Complete(id, rd.StepID, l, `"1"`)
	llm(3)
	k.Must(204, a.Request("POST", ex+"/resources/checkpoints", []byte(`{"captures":[{"key":"workspace","generation":5,"checkpoint_ref":"C2"}]}`), l))
	a.Finish(id, l, `{"answer":"done"}`)
	types := k.EventTypes(id)
	t.Log(kt.Join(types))
	cov := k.Must(200, k.Do("GET", ex+"/coverage", nil, nil))
	t.Log(string(cov.Body))
	var ranges struct {
		Ranges [][2]int `json:"covered_ranges"`
	}
	cov.JSON(t, &ranges)
	if fmt.Sprint(ranges.Ranges) != "[[1 4] [7 9] [15 18] [29 30]]" {
		t.Fatalf("ranges %v", ranges.Ranges)
	}
	fr := k.Do("POST", ex+"/fork", []byte(`{"at_seq":15}`), nil)
	if fr.Status != 201 {
		t.Fatalf("%s\n%s", fr, k.Stderr())
	}
	f := fr.Map(t)
	t.Log(f)
	fid := f["id"].(string)
	for _, e := range k.Events(fid) {
		b, _ := json.Marshal(e.Payload)
		t.Logf("%d %s %s", e.Seq, e.Type, b)
	}
	cov2 := k.Must(200, k.Do("GET", "/v0/executions/"+fid+"/coverage", nil, nil))
	t.Log(string(cov2.Body))
}
