package postgres_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	"github.com/rebuno/rebuno/internal/store/storetest"
)

// openAt opens a store on url, closed when the test ends.
func openAt(t testing.TB, url string, mod ...func(*postgres.Options)) *postgres.Store {
	t.Helper()
	// The stores' logs (leadership, reconnections) would interleave with
	// benchmark results; the tests assert what matters in them.
	opt := postgres.Options{URL: url, Migrate: true, MaxConns: 12, Logger: slog.New(slog.DiscardHandler)}
	for _, m := range mod {
		m(&opt)
	}
	s, err := postgres.Open(context.Background(), opt)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func open(t *testing.T) store.Store { return openAt(t, pgtest.NewDatabase(t)) }

func TestContract(t *testing.T) { storetest.Run(t, open) }

func TestDurability(t *testing.T) {
	urls := map[store.Store]string{}
	storetest.RunDurability(t, func(t *testing.T) store.Store {
		url := pgtest.NewDatabase(t)
		s := openAt(t, url)
		urls[s] = url
		return s
	}, func(t *testing.T, s store.Store) store.Store {
		url := urls[s]
		if err := s.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		reopened := openAt(t, url)
		urls[reopened] = url
		return reopened
	})
}

func TestShared(t *testing.T) {
	storetest.RunShared(t, storetest.SharedBackend{
		Open: func(t *testing.T) (store.Store, store.Store) {
			url := pgtest.NewDatabase(t)
			return openAt(t, url), openAt(t, url)
		},
		Limiters: func(t *testing.T) (storetest.Limiter, storetest.Limiter) {
			url := pgtest.NewDatabase(t)
			return openAt(t, url).Limiter(), openAt(t, url).Limiter()
		},
	})
}

func TestLimiter(t *testing.T) {
	storetest.RunLimiter(t, func(t *testing.T) storetest.Limiter { return openAt(t, pgtest.NewDatabase(t)).Limiter() })
}
