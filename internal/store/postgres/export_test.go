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
