package postgres

// SetQueryHook makes f see every query the SQL layer runs (nil: none), for
// the plan test, which lives outside the package because pgtest imports it.
func SetQueryHook(f func(query string)) {
	if f == nil {
		queryHook.Store(nil)
		return
	}
	queryHook.Store(&f)
}

// SetRoundTripHook makes f see every round trip of an operation's
// transaction (nil: none).
func SetRoundTripHook(f func()) {
	if f == nil {
		roundTripHook.Store(nil)
		return
	}
	roundTripHook.Store(&f)
}
