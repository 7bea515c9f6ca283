package policy

import (
	"fmt"
	"sync"
	"testing"
)

func bundleText(i int) string {
	return fmt.Sprintf("rules:\n  - id: rule-%d\n    then: {decision: allow}\n", i)
}

func TestCacheHitAndEviction(t *testing.T) {
	c := NewCache(2)
	a1, err := c.Get(bundleText(1))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Rules[0].ID != "rule-1" {
		t.Fatalf("compiled the wrong text: %+v", a1)
	}
	a2, _ := c.Get(bundleText(1))
	if a1 != a2 {
		t.Error("second Get of the same text compiled again")
	}
	b1, _ := c.Get(bundleText(2))
	c.Get(bundleText(1)) // 1 is now the most recently used
	c.Get(bundleText(3)) // evicts 2, the least recently used
	if c.order.Len() != 2 || len(c.entries) != 2 {
		t.Fatalf("cache holds %d/%d entries, want 2", c.order.Len(), len(c.entries))
	}
	if a3, _ := c.Get(bundleText(1)); a3 != a1 {
		t.Error("recently used entry was evicted")
	}
	if b2, _ := c.Get(bundleText(2)); b2 == b1 || b2.Rules[0].ID != "rule-2" {
		t.Error("least recently used entry was not evicted")
	}
}

func TestCacheErrorsAndEmpty(t *testing.T) {
	c := NewCache(0)
	if c.size != DefaultCacheSize {
		t.Errorf("NewCache(0) size = %d, want %d", c.size, DefaultCacheSize)
	}
	bad := "rules:\n  - id: default\n    then: {decision: allow}\n"
	b, err1 := c.Get(bad)
	if b != nil || err1 == nil {
		t.Fatalf("bad bundle: %v, %v", b, err1)
	}
	if _, err := Parse(bad); err.Error() != err1.Error() {
		t.Errorf("cached error %v differs from Parse's %v", err1, err)
	}
	if _, err2 := c.Get(bad); err2 != err1 {
		t.Error("the error was not cached")
	}
	if b, err := c.Get(""); b != nil || err != nil {
		t.Errorf(`Get("") = %v, %v`, b, err)
	}
	if c.order.Len() != 1 {
		t.Errorf("cache holds %d entries, want 1 (the empty text takes no slot)", c.order.Len())
	}
}

func TestCacheConcurrent(t *testing.T) {
	// Many goroutines asking for the same new text share one compilation.
	c := NewCache(16)
	text := manyRules(500)
	var wg sync.WaitGroup
	got := make([]*Bundle, 16)
	for i := range got {
		wg.Go(func() {
			b, err := c.Get(text)
			if err != nil {
				t.Error(err)
			}
			got[i] = b
		})
	}
	wg.Wait()
	for _, b := range got {
		if b != got[0] {
			t.Fatal("concurrent Gets of one text returned different bundles")
		}
	}

	// Churn through more texts than fit, so that hits, misses and
	// evictions race; every answer must still be its own text's bundle.
	c = NewCache(4)
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				n := (g + i) % 10
				b, err := c.Get(bundleText(n))
				if err != nil {
					t.Error(err)
					return
				}
				if want := fmt.Sprintf("rule-%d", n); b.Rules[0].ID != want {
					t.Errorf("Get(text %d) = bundle of %s", n, b.Rules[0].ID)
					return
				}
				b.Evaluate(Facts{Kind: "tool_call", Target: "x"})
			}
		})
	}
	wg.Wait()
	if c.order.Len() > 4 {
		t.Errorf("cache holds %d entries, more than its size 4", c.order.Len())
	}
}

// TestCacheCompilePanic: should compiling ever panic, the text must read
// as a broken bundle (denied), never as a nil bundle (no policy).
func TestCacheCompilePanic(t *testing.T) {
	c := NewCache(1)
	c.parse = func(string) (*Bundle, error) { panic("boom") }
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not reach the compiling caller")
			}
		}()
		c.Get("x: 1\n")
	}()
	if b, err := c.Get("x: 1\n"); b != nil || err != errCompilePanicked {
		t.Errorf("after a panic Get = %v, %v; want nil, errCompilePanicked", b, err)
	}
}
