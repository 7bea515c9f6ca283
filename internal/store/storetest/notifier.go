package storetest

import (
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

// notifierScenarios are the scenarios of notifications.
var notifierScenarios = []scenario{
	{"NotifierHearsItself", testNotifierHearsItself},
}

// A process hears its own notifications, whatever else carries them to the
// other processes.
func testNotifierHearsItself(t *testing.T, s store.Store) {
	heard := make(chan store.Notification, 4)
	s.Notifier().Listen(func(n store.Notification) {
		if n.Key == "exec-notified" {
			heard <- n
		}
	})
	want := store.Notification{Topic: store.TopicDelta, Key: "exec-notified", Data: []byte(`{"s":"x","q":1,"d":"hi"}`)}
	s.Notifier().Notify(want)
	select {
	case got := <-heard:
		if got.Topic != want.Topic || string(got.Data) != string(want.Data) {
			t.Fatalf("heard %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the notification was not heard by its own process")
	}
}
