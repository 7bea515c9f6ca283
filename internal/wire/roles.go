package wire

import "slices"

// Roles of API keys, least to most powerful: each role may do everything
// the ones before it may.
const (
	RoleViewer   = "viewer"   // read
	RoleApprover = "approver" // read, decide approvals
	RoleOperator = "operator" // read, decide approvals, create, cancel and fork executions
	RoleAdmin    = "admin"    // everything: agents, policies, keys, the audit log
)

// Roles lists the roles in order of power.
var Roles = []string{RoleViewer, RoleApprover, RoleOperator, RoleAdmin}

// ValidRole reports whether r is a role.
func ValidRole(r string) bool { return slices.Contains(Roles, r) }

// RoleAllows reports whether a key of role have may do what needs role need.
func RoleAllows(have, need string) bool {
	h, n := slices.Index(Roles, have), slices.Index(Roles, need)
	return h >= 0 && n >= 0 && h >= n
}
