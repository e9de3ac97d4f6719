package gpu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/gpu/gputest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func marshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSampler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := &clock{t: time.Date(2026, 12, 1, 22, 30, 0, 0, time.UTC)}
	var logs bytes.Buffer
	_, path := gputest.Write(t, gputest.TwoGPUs)
	s := NewSampler(&SamplerConfig{Path: path, Now: clk.Now, MaxAge: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})

	if got := marshal(t, s.Metrics()); got != `{"gpus":[]}` {
		t.Fatalf("before a sample: %s", got)
	}
	if err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	want := `{"gpus":[` +
		`{"index":0,"uuid":"GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f","utilization_pct":37,"memory_used_mb":1234,"memory_total_mb":24564,"temperature_c":55},` +
		`{"index":1,"uuid":"GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d","utilization_pct":0,"memory_used_mb":3,"memory_total_mb":24564,"temperature_c":31}],` +
		`"sampled_at":"2026-12-01T22:30:00Z"}`
	if got := marshal(t, s.Metrics()); got != want {
		t.Fatalf("Metrics:\n got %s\nwant %s", got, want)
	}

	// A failing sample keeps the last good one while it is recent, and
	// logs once.
	if err := writeOver(path, "#!exit 3"); err != nil {
		t.Fatal(err)
	}
	clk.add(30 * time.Second)
	for range 2 {
		if err := s.Sample(ctx); err == nil || !strings.Contains(err.Error(), "exit status 3") {
			t.Fatalf("Sample = %v, want exit status 3", err)
		}
	}
	if got := marshal(t, s.Metrics()); got != want {
		t.Fatalf("Metrics after a failed sample 30s later:\n got %s\nwant %s", got, want)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings for two failures, want 1:\n%s", n, logs.String())
	}
	clk.add(31 * time.Second)
	if got := marshal(t, s.Metrics()); got != `{"gpus":[]}` {
		t.Fatalf("Metrics past MaxAge: %s", got)
	}

	// N/A values are left out; recovery is logged.
	if err := writeOver(path, "0, GPU-0, [N/A], 10, [Not Supported], N/A\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := marshal(t, s.Metrics()), `{"gpus":[{"index":0,"uuid":"GPU-0","memory_used_mb":10}],"sampled_at":"2026-12-01T22:31:01Z"}`; got != want {
		t.Fatalf("Metrics with N/A:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(logs.String(), `msg="GPU sampling recovered" failures=2 over=31s`) {
		t.Errorf("no recovery logged:\n%s", logs.String())
	}

	// A malformed answer is an error that names the line; the last good
	// sample stays.
	for _, bad := range []string{"0, GPU-0, 1, 2, 3\n", "0, GPU-0, hot, 1, 2, 3\n", "0, GPU-0, 1, 2, 3, 4\n0, GPU-1, 1, 2, 3, 4\n"} {
		if err := writeOver(path, bad); err != nil {
			t.Fatal(err)
		}
		var pe *ParseError
		if err := s.Sample(ctx); !errors.As(err, &pe) || pe.Line == 0 {
			t.Errorf("Sample of %q = %v, want a *ParseError naming a line", bad, err)
		}
	}
	if got := s.Metrics(); len(got.GPUs) != 1 || got.GPUs[0].UUID != "GPU-0" {
		t.Errorf("Metrics after malformed answers: %+v", got)
	}
}

// writeOver replaces the sampler's answer of the fake at path.
func writeOver(path, answer string) error {
	return gputest.Rewrite(path, map[string]string{gputest.SampleQuery: answer})
}

// The largest answer a Sampler accepts marshals within the heartbeat's
// bound; one GPU more is refused.
func TestSamplerBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	line := func(i int) string {
		uuid := fmt.Sprintf("GPU-%0*d", MaxUUIDBytes-4, i)
		n := strconv.Itoa(math.MaxInt32)
		return strconv.Itoa(math.MaxInt32-i) + ", " + uuid + ", " + n + ", " + n + ", " + n + ", " + n + "\n"
	}
	var b strings.Builder
	for i := range MaxDevices {
		b.WriteString(line(i))
	}
	_, path := gputest.Write(t, map[string]string{gputest.SampleQuery: b.String()})
	s := NewSampler(&SamplerConfig{Path: path})
	if err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	m := s.Metrics()
	if len(m.GPUs) != MaxDevices {
		t.Fatalf("%d GPUs sampled, want %d", len(m.GPUs), MaxDevices)
	}
	got := marshal(t, m)
	if len(got) >= wire.MaxMetricsBytes {
		t.Fatalf("metrics of %d GPUs are %d bytes, over the heartbeat's %d", MaxDevices, len(got), wire.MaxMetricsBytes)
	}
	t.Logf("the largest metrics: %d bytes of %d", len(got), wire.MaxMetricsBytes)

	b.WriteString(line(MaxDevices))
	if err := gputest.Rewrite(path, map[string]string{gputest.SampleQuery: b.String()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Sample(ctx); err == nil || !strings.Contains(err.Error(), "more than 64 GPUs") {
		t.Fatalf("Sample of %d GPUs = %v, want refused", MaxDevices+1, err)
	}
	if got := marshal(t, s.Metrics()); len(got) >= wire.MaxMetricsBytes || !strings.Contains(got, `"index":2147483584`) {
		t.Errorf("the last good sample is not kept: %d bytes", len(got))
	}
}

// A hung nvidia-smi fails the sample within Timeout; Run stops with its
// context, and Metrics never waits for a sample.
func TestSamplerRun(t *testing.T) {
	t.Parallel()
	_, path := gputest.Write(t, map[string]string{gputest.SampleQuery: "#!exec /bin/sleep 5"})
	s := NewSampler(&SamplerConfig{Path: path, Timeout: 200 * time.Millisecond, Interval: 50 * time.Millisecond})
	start := time.Now()
	err := s.Sample(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer within 200ms") {
		t.Fatalf("Sample = %v, want a timeout", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a hung sample took %v", d)
	}

	// The fake notes that it was started, then hangs.
	started := filepath.Join(t.TempDir(), "started")
	if err := gputest.Rewrite(path, map[string]string{gputest.SampleQuery: "#!: > " + started + "; exec /bin/sleep 5"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		s.Run(ctx)
		close(done)
	}()
	waitfor.Until(t, "Run to be in a sample", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	start = time.Now()
	if got := marshal(t, s.Metrics()); got != `{"gpus":[]}` {
		t.Errorf("Metrics = %s", got)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("Metrics waited %v for a sample", d)
	}
	if err := gputest.Rewrite(path, gputest.TwoGPUs); err != nil {
		t.Fatal(err)
	}
	waitfor.Within(t, 10*time.Second, "Run to sample the two GPUs", func() bool { return len(s.Metrics().GPUs) == 2 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
