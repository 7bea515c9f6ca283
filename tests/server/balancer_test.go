package server_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// balancer is the load balancer in front of the replicas: each request
// goes to the next live replica in turn. A request that cannot reach its
// replica (connection refused) moves on to the next one, since nothing was
// sent; one whose replica dies after receiving it is cut, as a real
// balancer cuts it, and the client decides whether to send it again.
//
// A trap kills a replica (SIGKILL) at a chosen moment of a chosen request,
// which is how the crash tests place a kill at a phase of a step.
type balancer struct {
	t      *testing.T
	srv    *httptest.Server
	client *http.Client

	mu       sync.Mutex
	replicas []*kt.Kernel
	dead     map[*kt.Kernel]bool
	next     int
	trap     *trap
}

// killMoment is when a trap kills its replica.
type killMoment int

const (
	// whileInFlight: once the request is written to the replica, before it
	// answers; the replica may or may not have committed it.
	whileInFlight killMoment = iota
	// answerLost: once the replica has answered; the client never gets the
	// answer (its connection is cut).
	answerLost
	// afterRelay: once the answer has reached the client.
	afterRelay
)

// trap kills the replica that receives the first request matching it.
type trap struct {
	name   string
	match  func(r *http.Request, body []byte) bool
	when   killMoment
	victim *kt.Kernel
	hit    string // the request that sprang it
	once   sync.Once
	fired  chan struct{}
}

func newBalancer(t *testing.T, replicas ...*kt.Kernel) *balancer {
	b := &balancer{t: t, replicas: replicas, dead: map[*kt.Kernel]bool{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, ResponseHeaderTimeout: 60 * time.Second}}}
	b.srv = httptest.NewServer(b)
	t.Cleanup(func() {
		b.srv.Close()
		b.client.CloseIdleConnections()
	})
	return b
}

// URL is where clients and agents send their requests.
func (b *balancer) URL() string { return b.srv.URL }

// arm sets a trap; the replica receiving the first matching request dies.
func (b *balancer) arm(name string, when killMoment, match func(r *http.Request, body []byte) bool) *trap {
	tr := &trap{name: name, match: match, when: when, fired: make(chan struct{})}
	b.mu.Lock()
	b.trap = tr
	b.mu.Unlock()
	return tr
}

// revive puts a restarted replica back in the rotation.
func (b *balancer) revive(k *kt.Kernel) {
	b.mu.Lock()
	delete(b.dead, k)
	b.mu.Unlock()
}

// route picks the next live replica for a request, and the trap it springs.
func (b *balancer) route(r *http.Request, body []byte) (*kt.Kernel, *trap) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range b.replicas {
		k := b.replicas[b.next%len(b.replicas)]
		b.next++
		if b.dead[k] {
			continue
		}
		tr := b.trap
		if tr == nil || !tr.match(r, body) {
			return k, nil
		}
		b.trap, tr.victim, tr.hit = nil, k, r.Method+" "+r.URL.Path
		return k, tr
	}
	return nil, nil
}

func (b *balancer) kill(tr *trap) {
	tr.once.Do(func() {
		b.markDead(tr.victim)
		tr.victim.Kill()
		close(tr.fired)
	})
}

func (b *balancer) markDead(k *kt.Kernel) {
	b.mu.Lock()
	b.dead[k] = true
	b.mu.Unlock()
}

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	for range 2 * len(b.replicas) {
		k, tr := b.route(r, body)
		if k == nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"code":"unavailable","message":"no live replica"}`, http.StatusServiceUnavailable)
			return
		}
		ctx := r.Context()
		if tr != nil && tr.when == whileInFlight {
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) { b.kill(tr) },
			})
		}
		out, err := http.NewRequestWithContext(ctx, r.Method, k.URL+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		out.Header = r.Header.Clone()
		resp, err := b.client.Do(out)
		if err != nil {
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" && tr == nil {
				b.markDead(k) // killed by an earlier trap, or not restarted yet
				continue
			}
			if tr != nil {
				b.kill(tr) // the trap's request failed on its own: still a kill at that moment
			}
			panic(http.ErrAbortHandler)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		if tr != nil && tr.when == answerLost {
			b.kill(tr)
			panic(http.ErrAbortHandler)
		}
		for name, values := range resp.Header {
			w.Header()[name] = values
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(data)
		if tr != nil && tr.when == afterRelay {
			w.(http.Flusher).Flush()
			b.kill(tr)
		}
		return
	}
	panic(http.ErrAbortHandler)
}

// wait blocks until the trap has fired.
func (tr *trap) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-tr.fired:
	case <-time.After(d):
		t.Fatalf("trap %q never fired within %s", tr.name, d)
	}
}
