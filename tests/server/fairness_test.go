package server_test

import (
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestHostileAgentsCannotStarveOthersOnPostgres is the dispatch isolation
// scenario of the black-box suite on a server-mode replica: claims come from
// Postgres (FOR UPDATE SKIP LOCKED), the shares and the idle sleep are the same.
func TestHostileAgentsCannotStarveOthersOnPostgres(t *testing.T) {
	_, ks := replicas(t, 1, kt.HostileAgentsArgs...)
	kt.HostileAgents(t, ks[0])
}
