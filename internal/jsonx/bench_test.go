package jsonx

import (
	"strconv"
	"strings"
	"testing"
)

// typicalBody is a ~1 KiB step submit, the most frequent request body.
const typicalBody = `{
  "kind": "llm_call",
  "target": "gpt-4o",
  "idempotency": "safe_to_retry",
  "resources": [],
  "args": {
    "model": "gpt-4o",
    "temperature": 0.2,
    "max_tokens": 1024,
    "messages": [
      {"role": "system", "content": "You are a careful assistant. Answer briefly and cite the tool results you used."},
      {"role": "user", "content": "What is the weather in Zürich tomorrow, and should I bring an umbrella?\nThanks!"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_01", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Zürich\",\"day\":\"tomorrow\"}"}}]},
      {"role": "tool", "tool_call_id": "call_01", "content": "{\"high_c\":14.5,\"low_c\":6,\"rain_mm\":3.2,\"summary\":\"showers <afternoon>\"}"}
    ],
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "string", "enum": ["today", "tomorrow"]}}, "required": ["city"]}}}
    ],
    "metadata": {"trace": "0af7651916cd43dd8448eb211c80319c", "attempt": 1, "cached": false, "tags": null}
  }
}`

func largeDocument(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"id":` + strconv.Itoa(i) + `,"name":"item-` + strconv.Itoa(i) + `","price":` + strconv.Itoa(i%997) + `.99,` +
			`"tags":["alpha","beta","ünïcødé"],"note":"line one\nline \"two\" \u00e9","active":true,"parent":null}`)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"1KiB", []byte(typicalBody)},
		{"1MiB", largeDocument(1 << 20)},
	} {
		if _, err := Parse(bc.data, testDepth); err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(bc.data, testDepth); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCanonical(b *testing.B) {
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"1KiB", []byte(typicalBody)},
		{"1MiB", largeDocument(1 << 20)},
	} {
		v, err := Parse(bc.data, testDepth)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				Canonical(v)
			}
		})
	}
}
