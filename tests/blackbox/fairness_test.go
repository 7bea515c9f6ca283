package blackbox

import (
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestHostileAgentsCannotStarveOthers: one agent's hanging, slow or failing
// webhooks do not delay another agent's deliveries, and the dispatcher
// sleeps rather than spins while only hanging deliveries are left
// (kt.HostileAgents; tests/server runs the same on Postgres).
func TestHostileAgentsCannotStarveOthers(t *testing.T) {
	kt.HostileAgents(t, kt.Start(t, kt.Options{Args: kt.HostileAgentsArgs}))
}
