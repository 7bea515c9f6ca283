package kernel

import (
	"sync"
	"time"
)

// expiring remembers values read from the store for ttl, so that a hot read
// (an agent's secret on every signed request, its policy on every new step,
// a key on every request that presents it) costs no query, while a change
// made on another process still applies within ttl. A change made on this
// process forgets the value at once. It holds at most expiringCap entries and
// starts over when full: its purpose is to save reads, not to remember.
type expiring[V any] struct {
	mu sync.Mutex
	m  map[string]expiringEntry[V]
}

type expiringEntry[V any] struct {
	v       V
	expires time.Time
}

const expiringCap = 10000

// get returns the value of key, loading it when it is not remembered or
// expired at now.
func (c *expiring[V]) get(key string, now time.Time, ttl time.Duration, load func() (V, error)) (V, error) {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.v, nil
	}
	v, err := load()
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= expiringCap {
		c.m = map[string]expiringEntry[V]{}
	}
	c.m[key] = expiringEntry[V]{v: v, expires: now.Add(ttl)}
	c.mu.Unlock()
	return v, nil
}

// forget drops one key; forgetAll every one.
func (c *expiring[V]) forget(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.mu.Unlock()
}

func (c *expiring[V]) forgetAll() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}
