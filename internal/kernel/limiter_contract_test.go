package kernel

import (
	"testing"

	"github.com/rebuno/rebuno/internal/store/storetest"
)

// The in-memory limiter keeps the same buckets as the one server mode keeps
// in the store: both pass storetest's limiter scenarios.
func TestMemoryLimiterContract(t *testing.T) {
	storetest.RunLimiter(t, func(*testing.T) storetest.Limiter { return NewMemoryLimiter() })
}
