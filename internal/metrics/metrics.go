// Package metrics defines every Prometheus series the kernel exports (docs/protocol/operations.md §1).
// Label sets that are closed are initialised at zero so dashboards see them
// before the first event.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rebuno/rebuno/internal/wire"
)

// Metrics holds the kernel's collectors, registered on Registry.
type Metrics struct {
	Registry *prometheus.Registry

	ReplayTotal          *prometheus.CounterVec
	DispatchOutcomes     *prometheus.CounterVec
	DispatchLatency      prometheus.Histogram
	DispatchesReclaimed  prometheus.Counter
	DispatchSuperseded   prometheus.Counter
	QueueDepth           prometheus.Gauge
	PolicyLatency        prometheus.Histogram
	PolicyDecisions      *prometheus.CounterVec
	ApprovalOutcomes     *prometheus.CounterVec
	ApprovalWait         prometheus.Histogram
	StepsSubmitted       *prometheus.CounterVec
	StepOutcomes         *prometheus.CounterVec
	ExecutionsCreated    prometheus.Counter
	ExecutionsCompleted  *prometheus.CounterVec
	WorkerErrors         *prometheus.CounterVec
	RateLimitDecisions   *prometheus.CounterVec
	HTTPRequests         *prometheus.CounterVec
	HTTPDuration         *prometheus.HistogramVec
	StreamConnections    *prometheus.GaugeVec
	WaitingReads         prometheus.Gauge
	StoreCommitBatchSize prometheus.Histogram
	StoreCommitSeconds   prometheus.Histogram
	Checkpoints          prometheus.Counter
	CheckpointFailures   *prometheus.CounterVec
	Forks                *prometheus.CounterVec
	ForkDuration         prometheus.Histogram
}

// New creates and registers every series, plus the Go and process collectors.
func New() *Metrics {
	const ns = "rebuno"
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		ReplayTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "replay_total",
			Help: "Submits of existing steps (hit=true) and of new steps (hit=false)."}, []string{"hit"}),
		DispatchOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dispatch_outcomes_total",
			Help: "Webhook delivery attempts by outcome."}, []string{"outcome"}),
		DispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "dispatch_latency_seconds",
			Help: "Time from a dispatch becoming due to the agent's answer.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		DispatchesReclaimed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "dispatches_reclaimed_total",
			Help: "Dispatches whose lease expired and were reclaimed."}),
		DispatchSuperseded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "dispatch_superseded_total",
			Help: "Agent requests refused with 409 lease_superseded."}),
		QueueDepth: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "queue_depth",
			Help: "Dispatches that are due and not yet delivered."}),
		PolicyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "policy_latency_seconds",
			Help: "Policy evaluation time per new step.", Buckets: prometheus.ExponentialBuckets(0.000001, 4, 12)}),
		PolicyDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "policy_decisions_total",
			Help: "Policy decisions for new steps."}, []string{"decision"}),
		ApprovalOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "approval_outcomes_total",
			Help: "Approvals by how they ended."}, []string{"outcome"}),
		ApprovalWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "approval_wait_seconds",
			Help: "Time from an approval request to its decision.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		StepsSubmitted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "steps_submitted_total",
			Help: "New steps recorded, by kind."}, []string{"kind"}),
		StepOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "step_outcomes_total",
			Help: "Step outcomes recorded, by how they arrived: their own complete or fail, or carried by the next request."}, []string{"route"}),
		ExecutionsCreated: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "executions_created_total",
			Help: "Executions created."}),
		ExecutionsCompleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "executions_completed_total",
			Help: "Executions that reached a terminal status."}, []string{"status"}),
		WorkerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "worker_errors_total",
			Help: "Errors of background workers."}, []string{"worker"}),
		RateLimitDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rate_limit_decisions_total",
			Help: "Rate limiter refusals and limiter failures."}, []string{"outcome"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "http_requests_total",
			Help: "HTTP requests by route pattern and status."}, []string{"route", "status"}),
		HTTPDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "http_request_duration_seconds",
			Help: "HTTP request duration by route pattern and status.", Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14)}, []string{"route", "status"}),
		StreamConnections: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "stream_connections",
			Help: "Open SSE connections."}, []string{"kind"}),
		WaitingReads: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "waiting_reads",
			Help: "Requests held until an execution ends (reads and creates with wait)."}),
		StoreCommitBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "store_commit_batch_size",
			Help: "Transactions sharing one physical commit.", Buckets: prometheus.ExponentialBuckets(1, 2, 9)}),
		StoreCommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "store_commit_seconds",
			Help: "Duration of one group commit.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}),
		Checkpoints: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "checkpoints_total",
			Help: "Resource captures accepted as checkpoints."}),
		CheckpointFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "checkpoint_failures_total",
			Help: "Capture failures reported by agents and captures the kernel refused, by error."}, []string{"error"}),
		Forks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "forks_total",
			Help: "Forks created, by whether the fork point was covered."}, []string{"covered"}),
		ForkDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "fork_duration_seconds",
			Help: "Time to create a fork.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
	}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.ReplayTotal, m.DispatchOutcomes, m.DispatchLatency, m.DispatchesReclaimed, m.DispatchSuperseded, m.QueueDepth,
		m.PolicyLatency, m.PolicyDecisions, m.ApprovalOutcomes, m.ApprovalWait, m.StepsSubmitted, m.StepOutcomes, m.ExecutionsCreated,
		m.ExecutionsCompleted, m.WorkerErrors, m.RateLimitDecisions, m.HTTPRequests, m.HTTPDuration, m.StreamConnections,
		m.WaitingReads, m.StoreCommitBatchSize, m.StoreCommitSeconds, m.Checkpoints, m.CheckpointFailures, m.Forks, m.ForkDuration)
	for _, w := range []string{"dispatcher", "lease_reclaim", "deadline", "approval_expiry", "idempotency_sweep", "retention"} {
		m.WorkerErrors.WithLabelValues(w)
	}
	for _, v := range []string{"true", "false"} {
		m.ReplayTotal.WithLabelValues(v)
	}
	for _, v := range []string{"success", "rejected", "exhausted"} {
		m.DispatchOutcomes.WithLabelValues(v)
	}
	for _, v := range []string{"allow", "deny", "require_approval"} {
		m.PolicyDecisions.WithLabelValues(v)
	}
	for _, v := range []string{wire.ApprovalGranted, wire.ApprovalDenied, wire.ApprovalExpired} {
		m.ApprovalOutcomes.WithLabelValues(v)
	}
	for _, v := range []string{wire.KindToolCall, wire.KindLLMCall, wire.KindLocal} {
		m.StepsSubmitted.WithLabelValues(v)
	}
	for _, v := range []string{"separate", "carried"} {
		m.StepOutcomes.WithLabelValues(v)
	}
	for _, v := range wire.ExecTerminalStatuses {
		m.ExecutionsCompleted.WithLabelValues(v)
	}
	// The workers that report errors, so that the series exists before the
	// first error (docs/protocol/operations.md §1 requires every series to be exported).
	for _, v := range []string{"dispatcher", "deadline", "idempotency_sweep", "retention"} {
		m.WorkerErrors.WithLabelValues(v)
	}
	for _, v := range []string{"limited", "error_allowed", "error_denied"} {
		m.RateLimitDecisions.WithLabelValues(v)
	}
	for _, v := range []string{"reported", "unknown_resource", "missing_checkpoint_ref", "checkpoint_ref_too_long",
		"duplicate_capture", "stale_generation", "writers_active"} {
		m.CheckpointFailures.WithLabelValues(v)
	}
	for _, v := range []string{"true", "false"} {
		m.Forks.WithLabelValues(v)
	}
	for _, v := range []string{"events", "deltas"} {
		m.StreamConnections.WithLabelValues(v)
	}
	return m
}

// ObserveCommit implements the store's commit observer.
func (m *Metrics) ObserveCommit(batchSize int, d time.Duration) {
	m.StoreCommitBatchSize.Observe(float64(batchSize))
	m.StoreCommitSeconds.Observe(d.Seconds())
}
