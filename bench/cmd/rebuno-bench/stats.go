package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// summary describes a set of latency samples.
type summary struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"-"`
	P90  time.Duration `json:"-"`
	P99  time.Duration `json:"-"`
	Max  time.Duration `json:"-"`
	Mean time.Duration `json:"-"`
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted
// samples: the smallest sample at or below which at least p of all samples
// lie.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(p*float64(n) + 0.999999999)
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	return sorted[rank-1]
}

// summarize sorts samples in place and describes them.
func summarize(samples []time.Duration) summary {
	s := summary{N: len(samples)}
	if len(samples) == 0 {
		return s
	}
	slices.Sort(samples)
	var total time.Duration
	for _, d := range samples {
		total += d
	}
	s.P50 = percentile(samples, 0.50)
	s.P90 = percentile(samples, 0.90)
	s.P99 = percentile(samples, 0.99)
	s.Max = samples[len(samples)-1]
	s.Mean = total / time.Duration(len(samples))
	return s
}

func (s summary) String() string {
	if s.N == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (n=%d)", ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Max), s.N)
}

// ms formats a duration in milliseconds with microsecond resolution.
func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fsyncResult is the disk's measured durable-write latency.
type fsyncResult struct {
	N   int
	P50 time.Duration
	P99 time.Duration
	Err error
}

// measureFsync writes 4 KiB blocks into a preallocated file in dir and
// fsyncs after each, as a database commit does, for at most d or n writes.
func measureFsync(dir string, d time.Duration, n int) fsyncResult {
	path := filepath.Join(dir, "fsync-probe")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return fsyncResult{Err: err}
	}
	defer os.Remove(path)
	defer f.Close()
	const block, blocks = 4096, 256
	buf := make([]byte, block)
	if err := f.Truncate(block * blocks); err != nil {
		return fsyncResult{Err: err}
	}
	if err := f.Sync(); err != nil {
		return fsyncResult{Err: err}
	}
	var samples []time.Duration
	deadline := time.Now().Add(d)
	for i := 0; i < n+10 && time.Now().Before(deadline); i++ {
		buf[0], buf[1] = byte(i), byte(i>>8)
		t := time.Now()
		if _, err := f.WriteAt(buf, int64(i%blocks)*block); err != nil {
			return fsyncResult{Err: err}
		}
		if err := f.Sync(); err != nil {
			return fsyncResult{Err: err}
		}
		if i >= 10 { // the first writes warm the file's metadata
			samples = append(samples, time.Since(t))
		}
	}
	s := summarize(samples)
	return fsyncResult{N: s.N, P50: s.P50, P99: s.P99}
}
