package gpu

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// The Sampler's defaults.
const (
	// DefaultSampleInterval is how often a Sampler runs nvidia-smi.
	DefaultSampleInterval = 10 * time.Second
	// DefaultMaxAge is how long a Sampler's last good sample is served
	// while the samples after it fail.
	DefaultMaxAge = time.Minute
)

// sampleFields are the fields a Sampler asks for, in order.
var sampleFields = []string{"index", "uuid", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu"}

// Metrics is a heartbeat's metrics object:
//
//	{"gpus": [{"index": 0, "uuid": "GPU-...", "utilization_pct": 37,
//	  "memory_used_mb": 1234, "memory_total_mb": 24564, "temperature_c": 55}],
//	 "sampled_at": "2026-12-01T22:30:00Z"}
//
// GPUs is [] (never null) when there is no recent sample, and SampledAt
// then absent. With at most MaxDevices GPUs, each UUID at most
// MaxUUIDBytes and each number at most MaxInt32, it marshals to less
// than wire.MaxMetricsBytes.
type Metrics struct {
	GPUs      []GPUSample `json:"gpus"`
	SampledAt *time.Time  `json:"sampled_at,omitempty"`
}

// GPUSample is one GPU's sample. A value nvidia-smi could not give is
// nil, and absent from the JSON.
type GPUSample struct {
	Index          int    `json:"index"`
	UUID           string `json:"uuid"`
	UtilizationPct *int   `json:"utilization_pct,omitempty"`
	MemoryUsedMB   *int   `json:"memory_used_mb,omitempty"`
	MemoryTotalMB  *int   `json:"memory_total_mb,omitempty"`
	TemperatureC   *int   `json:"temperature_c,omitempty"`
}

// SamplerConfig configures a Sampler. Every field is optional.
type SamplerConfig struct {
	// Path is the nvidia-smi to run; "" looks "nvidia-smi" up on PATH.
	Path string
	// Interval is how often Run samples. Defaults to
	// DefaultSampleInterval.
	Interval time.Duration
	// Timeout bounds one run of nvidia-smi. Defaults to DefaultTimeout.
	Timeout time.Duration
	// MaxAge is how long the last good sample is served while later
	// samples fail; past it Metrics has no GPUs. Defaults to
	// DefaultMaxAge.
	MaxAge time.Duration
	// Now is the clock of sampled_at and MaxAge. Defaults to time.Now.
	Now func() time.Time
	// Logger receives a failing sampler's first error (WARN; the
	// failures that follow at DEBUG) and its recovery (INFO). Defaults to
	// discarding them.
	Logger *slog.Logger
}

// Sampler keeps a recent sample of the GPUs' use for heartbeats: Run
// samples in the background, and Metrics, which never runs nvidia-smi,
// hands out the latest. A Sampler is safe for concurrent use.
type Sampler struct {
	cfg SamplerConfig

	mu       sync.Mutex
	last     *Metrics // the last good sample, nil before one
	failures int      // samples failed in a row
	failedAt time.Time
}

// NewSampler returns a Sampler; cfg may be nil.
func NewSampler(cfg *SamplerConfig) *Sampler {
	s := &Sampler{}
	if cfg != nil {
		s.cfg = *cfg
	}
	if s.cfg.Interval <= 0 {
		s.cfg.Interval = DefaultSampleInterval
	}
	if s.cfg.Timeout <= 0 {
		s.cfg.Timeout = DefaultTimeout
	}
	if s.cfg.MaxAge <= 0 {
		s.cfg.MaxAge = DefaultMaxAge
	}
	if s.cfg.Now == nil {
		s.cfg.Now = time.Now
	}
	if s.cfg.Logger == nil {
		s.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return s
}

// Run samples at once and then every Interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = s.Sample(ctx)
		t.Reset(s.cfg.Interval)
	}
}

// Sample runs nvidia-smi once, within Timeout, and keeps its answer for
// Metrics. On an error it keeps the last good sample, and returns the
// error.
func (s *Sampler) Sample(ctx context.Context) error {
	m, err := s.sample(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.cfg.Logger
	if err != nil {
		if ctx.Err() != nil {
			return err // shutting down: not the GPUs' failure
		}
		s.failures++
		if s.failures == 1 {
			s.failedAt = s.cfg.Now()
			log.Warn("GPU sampling failing; heartbeats carry the last good sample while it is recent", "err", err, "max_age", s.cfg.MaxAge)
		} else {
			log.Debug("GPU sampling still failing", "err", err, "failures", s.failures)
		}
		return err
	}
	if s.failures > 0 {
		log.Info("GPU sampling recovered", "failures", s.failures, "over", s.cfg.Now().Sub(s.failedAt))
		s.failures = 0
	}
	s.last = m
	return nil
}

func (s *Sampler) sample(ctx context.Context) (*Metrics, error) {
	lines, err := query(ctx, s.cfg.Path, s.cfg.Timeout, sampleFields)
	if err != nil {
		return nil, err
	}
	at := s.cfg.Now().UTC().Truncate(time.Second)
	m := &Metrics{GPUs: make([]GPUSample, 0, len(lines)), SampledAt: &at}
	seen := newSeen()
	for _, l := range lines {
		var g GPUSample
		var ok bool
		if g.Index, g.UUID, ok = l.id(seen); !ok {
			return nil, l.err
		}
		for _, f := range []struct {
			i    int
			dst  **int
			name string
		}{{2, &g.UtilizationPct, "utilization.gpu"}, {3, &g.MemoryUsedMB, "memory.used"}, {4, &g.MemoryTotalMB, "memory.total"}, {5, &g.TemperatureC, "temperature.gpu"}} {
			if l.field(f.i) == "" {
				continue
			}
			v, ok := l.number(f.i, f.name)
			if !ok {
				return nil, l.err
			}
			*f.dst = &v
		}
		m.GPUs = append(m.GPUs, g)
	}
	// The bounds above keep it far below; this keeps a heartbeat from
	// being refused whatever changes.
	if b, err := json.Marshal(m); err != nil || len(b) >= wire.MaxMetricsBytes {
		return nil, fmt.Errorf("GPU metrics of %d bytes, over the heartbeat's %d (%v)", len(b), wire.MaxMetricsBytes, err)
	}
	return m, nil
}

// Metrics is the last good sample if it is at most MaxAge old, else no
// GPUs. It never runs nvidia-smi, and so never delays a heartbeat.
func (s *Sampler) Metrics() Metrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil || s.cfg.Now().Sub(*s.last.SampledAt) > s.cfg.MaxAge {
		return Metrics{GPUs: []GPUSample{}}
	}
	return *s.last
}
