package postgres_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
)

// BenchmarkNotifyAcross measures how long a notification takes from Notify
// on one store to a listener of another store on the same database: what a
// live event or delta adds between replicas. One notification in flight at
// a time; the large case goes through a payload row.
func BenchmarkNotifyAcross(b *testing.B) {
	for _, size := range []int{100, 20000} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			url := pgtest.NewDatabase(b)
			sender, receiver := openAt(b, url), openAt(b, url)
			heard := make(chan time.Time, 1)
			receiver.Notifier().Listen(func(n store.Notification) {
				if n.Key == "bench" {
					heard <- time.Now()
				}
			})
			data := []byte(strings.Repeat("x", size))
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				sent := time.Now()
				sender.Notifier().Notify(store.Notification{Topic: store.TopicDelta, Key: "bench", Data: data})
				select {
				case at := <-heard:
					lat = append(lat, at.Sub(sent))
				case <-time.After(10 * time.Second):
					b.Fatal("not heard within 10s")
				}
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
