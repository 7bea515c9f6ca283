package store

import "sync"

// Topics of notifications. A notification is news that makes waiting work
// worth re-reading the store; it never carries state the store does not
// hold, except live step deltas, which are never stored (docs/protocol).
const (
	// TopicEvents: the log of execution Key grew (SSE tails re-read it).
	TopicEvents = "events"
	// TopicEnded: execution Key became terminal (waiting reads re-read it).
	TopicEnded = "ended"
	// TopicDispatch: a dispatch became due (dispatchers look for work).
	TopicDispatch = "dispatch"
	// TopicDelta: a live delta of a running step of execution Key; Data is
	// the delta as the stream route frames it.
	TopicDelta = "delta"
	// TopicResync: notifications from the other processes may have been
	// lost (the backend's listening connection broke and is back), so
	// everything waiting on this process re-reads the store now rather
	// than at its next poll. Only a backend raises it, in process; it never
	// crosses processes.
	TopicResync = "resync"
)

// Notification is one signal.
type Notification struct {
	Topic string
	Key   string
	Data  []byte
}

// Notifier fans notifications out to every kernel process that shares a
// store. A process hears its own notifications too, at once and in process;
// the other processes hear them through the backend (Postgres LISTEN/NOTIFY),
// best effort: a lost notification only delays work until the next poll,
// which every waiter keeps as a safety net.
type Notifier interface {
	// Notify sends n. It must not block on the network: callers run it on
	// the request path, after their commit.
	Notify(n Notification)
	// Listen registers fn for every notification from now on. fn runs on
	// the notifier's goroutine and must not block.
	Listen(fn func(Notification))
}

// LocalNotifier is the Notifier of a store that one process owns: delivery
// is a direct call.
type LocalNotifier struct {
	mu        sync.RWMutex
	listeners []func(Notification)
}

// Notify implements Notifier.
func (l *LocalNotifier) Notify(n Notification) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, fn := range l.listeners {
		fn(n)
	}
}

// Listen implements Notifier.
func (l *LocalNotifier) Listen(fn func(Notification)) {
	l.mu.Lock()
	l.listeners = append(l.listeners, fn)
	l.mu.Unlock()
}
