package jsonx

import (
	"strings"
	"testing"
)

func TestObject(t *testing.T) {
	verbatim := []byte("{\"b\": 1,  \"a\":2}")
	tests := []struct {
		name  string
		build func(o *Object)
		want  string
	}{
		{"empty", func(o *Object) {}, `{}`},
		{"sorted keys", func(o *Object) {
			o.Int("seq", 3).String("type", "step.failed").Bool("retry", true).Bool("final", false)
		}, `{"final":false,"retry":true,"seq":3,"type":"step.failed"}`},
		{"sorted by UTF-8 bytes", func(o *Object) {
			o.Int("é", 1).Int("z", 2).Int("A", 3).Int("a", 4).Int("", 5)
		}, `{"":5,"A":3,"a":4,"z":2,"é":1}`},
		{"string escaping", func(o *Object) {
			o.String("msg", "a\"b\\c\n<d>&\u2028\x01é")
		}, `{"msg":"a\"b\\c\n\u003cd\u003e\u0026\u2028\u0001é"}`},
		{"keys escaped", func(o *Object) { o.Int("<k>", 1) }, `{"\u003ck\u003e":1}`},
		{"raw verbatim", func(o *Object) {
			o.Raw("output", verbatim).String("id", "x")
		}, "{\"id\":\"x\",\"output\":{\"b\": 1,  \"a\":2}}"},
		{"raw number literal kept", func(o *Object) { o.Raw("n", []byte("1.50e+2")) }, `{"n":1.50e+2}`},
		{"nil and empty raw are null", func(o *Object) {
			o.Raw("a", nil).Raw("b", []byte{})
		}, `{"a":null,"b":null}`},
		{"ints", func(o *Object) {
			o.Int("max", 1<<63-1).Int("min", -1<<63).Int("zero", 0)
		}, `{"max":9223372036854775807,"min":-9223372036854775808,"zero":0}`},
		{"strings", func(o *Object) {
			o.Strings("none", nil).Strings("empty", []string{}).Strings("two", []string{"a", "<b>"})
		}, `{"empty":[],"none":[],"two":["a","\u003cb\u003e"]}`},
		{"nested via Raw", func(o *Object) {
			o.Raw("error", new(Object).String("message", "boom").String("code", "x").Bytes())
		}, `{"error":{"code":"x","message":"boom"}}`},
		{"many members", func(o *Object) {
			for _, k := range strings.Split("p o n m l k j i h g f e d c b a", " ") {
				o.String(k, k)
			}
		}, `{"a":"a","b":"b","c":"c","d":"d","e":"e","f":"f","g":"g","h":"h","i":"i","j":"j","k":"k","l":"l","m":"m","n":"n","o":"o","p":"p"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o Object
			tt.build(&o)
			if got := string(o.Bytes()); got != tt.want {
				t.Errorf("Bytes()\n got %s\nwant %s", got, tt.want)
			}
			if got := string(o.Append([]byte("x"))); got != "x"+tt.want {
				t.Errorf("Append()\n got %s\nwant x%s", got, tt.want)
			}
			if _, err := Parse(o.Bytes(), testDepth); err != nil {
				t.Errorf("output is not strict JSON: %v", err)
			}
		})
	}
	if string(verbatim) != "{\"b\": 1,  \"a\":2}" {
		t.Error("Object modified a Raw value")
	}
}

func TestObjectDuplicateKeyPanics(t *testing.T) {
	for _, n := range []int{2, 20} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), `duplicate key "k0"`) {
					t.Errorf("n=%d: recover() = %v, want a duplicate key panic", n, r)
				}
			}()
			var o Object
			for i := range n - 1 {
				o.Int("k"+string(rune('a'+i)), 0)
			}
			o.Int("k0", 1).String("k0", "again")
			o.Bytes()
		}()
	}
}
