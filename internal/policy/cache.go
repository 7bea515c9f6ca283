package policy

import (
	"container/list"
	"crypto/sha256"
	"errors"
	"sync"
	"unsafe"
)

// DefaultCacheSize is the bound docs/protocol/governance.md §2.1 puts on the compiled-bundle cache.
const DefaultCacheSize = 1024

// errCompilePanicked is what waiters see if compiling panicked: an error,
// so that the kernel denies (bundle-error) rather than reading a nil
// bundle as "no policy".
var errCompilePanicked = errors.New("policy: compiling the bundle panicked")

// Cache holds compiled bundles keyed by the SHA-256 of their text, in an
// LRU. Keying by content rather than by agent means a changed bundle is
// simply a miss, with no invalidation to get wrong, and agents sharing a
// bundle share its compiled form. It is safe for concurrent use.
type Cache struct {
	mu      sync.Mutex
	size    int
	order   list.List // of *cacheEntry, most recently used first
	entries map[[sha256.Size]byte]*list.Element
	parse   func(string) (*Bundle, error) // Parse; replaced in tests
}

type cacheEntry struct {
	key [sha256.Size]byte
	// ready is closed once bundle and err are set; concurrent Gets of the
	// same new text wait for one compilation instead of each doing it.
	ready  chan struct{}
	bundle *Bundle
	err    error
}

// NewCache returns a cache of at most size bundles; size ≤ 0 means
// DefaultCacheSize.
func NewCache(size int) *Cache {
	if size <= 0 {
		size = DefaultCacheSize
	}
	return &Cache{size: size, entries: make(map[[sha256.Size]byte]*list.Element), parse: Parse}
}

// Get returns the compiled bundle for text, as Parse would. A text that
// fails to compile is cached with its error, so that a bad stored bundle
// is not recompiled on every step. The empty text is (nil, nil) and takes
// no slot.
func (c *Cache) Get(text string) (*Bundle, error) {
	if text == "" {
		return nil, nil
	}
	// Hashing the string's bytes in place avoids copying up to 1 MiB on
	// every lookup; sha256 only reads them.
	key := sha256.Sum256(unsafe.Slice(unsafe.StringData(text), len(text)))
	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		c.order.MoveToFront(el)
		c.mu.Unlock()
		e := el.Value.(*cacheEntry)
		<-e.ready
		return e.bundle, e.err
	}
	e := &cacheEntry{key: key, ready: make(chan struct{})}
	c.entries[key] = c.order.PushFront(e)
	for c.order.Len() > c.size {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(*cacheEntry).key)
	}
	c.mu.Unlock()

	// Compiling outside the lock keeps one large bundle from stalling
	// every other agent's lookups.
	c.fill(e, text)
	return e.bundle, e.err
}

func (c *Cache) fill(e *cacheEntry, text string) {
	defer close(e.ready)
	e.err = errCompilePanicked
	e.bundle, e.err = c.parse(text)
}
