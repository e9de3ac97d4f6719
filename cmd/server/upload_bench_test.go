//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// BenchmarkArtifactUpload uploads artifacts through a cmd/server process
// over loopback HTTP to its default store (the directory beside its
// SQLite database), with the Go worker client: each part is a signed PUT
// the server hashes and streams into the file store. It reports the
// throughput (MB/s, from the artifact's size) and the server's resident
// memory before the first upload and at its peak during the uploads
// (read from /proc every 10 ms): streamed parts keep the peak flat, far
// below one part, let alone the artifact.
//
//	go test -run '^$' -bench ArtifactUpload -benchtime 3x ./cmd/server
//	NODELANE_BENCH_ARTIFACT_BYTES=$((1<<30)) go test -run '^$' -bench ArtifactUpload -benchtime 1x ./cmd/server
func BenchmarkArtifactUpload(b *testing.B) {
	size := int64(256 << 20)
	if v := os.Getenv("NODELANE_BENCH_ARTIFACT_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("NODELANE_BENCH_ARTIFACT_BYTES=%q: want a positive number of bytes", v)
		}
		size = n
	}
	dir := b.TempDir()
	bin := filepath.Join(dir, "server")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	srv := startBenchServer(b, bin, dir)
	tokens := srv.tokens(b)

	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		b.Fatal(err)
	}
	c, err := client.New("http://"+srv.addr, &client.Config{Identity: id})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Register(ctx, tokens.ProvisioningToken, wire.RegisterRequest{
		NodeID: "bench", Name: "bench", Hostname: "bench.local", Role: "local_gpu_compute",
		Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}, GovernorLimits: wire.GovernorLimits{MaxJobs: 1},
		Version: "bench", HeartbeatIntervalSeconds: 30,
	}); err != nil {
		b.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+srv.addr+"/operator/jobs", strings.NewReader(`{"job_type":"status_check"}`))
	req.Header.Set("Authorization", "Bearer "+tokens.OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		b.Fatalf("enqueue: %s", resp.Status)
	}
	lr, err := c.Lease(ctx, wire.LeaseRequest{MaxJobs: 1, Accept: true})
	if err != nil || len(lr.Leases) != 1 {
		b.Fatalf("lease: %v %+v", err, lr)
	}
	g := lr.Leases[0]

	before, err := srv.rss()
	if err != nil {
		b.Fatal(err)
	}
	peak := newPeak(srv)
	serverCPU0, err := srv.cpu()
	if err != nil {
		b.Fatal(err)
	}
	clientCPU0 := selfCPU()
	b.SetBytes(size)
	for i := 0; b.Loop(); i++ {
		out, err := c.UploadArtifact(ctx, g.Job.ID, g.LeaseToken, pattern{}, size,
			client.ArtifactFile{Name: fmt.Sprintf("model-%d.bin", i), Type: "file"})
		if err != nil {
			b.Fatalf("upload %d: %v", i, err)
		}
		if !out.Stored {
			b.Fatalf("upload %d: not stored: %+v", i, out)
		}
	}
	b.StopTimer()
	high := peak.stop()
	serverCPU1, err := srv.cpu()
	if err != nil {
		b.Fatal(err)
	}
	gib := float64(size) * float64(b.N) / (1 << 30)
	b.ReportMetric(float64(before)/(1<<20), "rss-before-MiB")
	b.ReportMetric(float64(high)/(1<<20), "rss-peak-MiB")
	// CPU per GiB, which the machine's other load does not change: the
	// throughput one core each would give is 1 GiB / the larger of the two.
	b.ReportMetric((serverCPU1-serverCPU0).Seconds()/gib, "server-cpu-s/GiB")
	b.ReportMetric((selfCPU()-clientCPU0).Seconds()/gib, "client-cpu-s/GiB")
}

// cpu returns the CPU time (user and system) the server has used.
func (s *benchServer) cpu() (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's name, which ends with ')': utime and
	// stime are the 12th and 13th of them, in clock ticks (100 a second).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat has %d fields", s.cmd.Process.Pid, len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", s.cmd.Process.Pid, f[11], f[12])
	}
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}

// selfCPU returns the CPU time this process (the client) has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pattern is an endless artifact: byte i is a function of i, read
// without holding it, so the client's memory does not depend on the
// artifact's size either.
type pattern struct{}

var patternBlock = func() []byte {
	b := make([]byte, 1<<20)
	_, _ = rand.Read(b)
	return b
}()

func (pattern) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		i := (off + int64(n)) % int64(len(patternBlock))
		n += copy(p[n:], patternBlock[i:])
	}
	return n, nil
}

type benchServer struct {
	cmd        *exec.Cmd
	addr       string
	tokensFile string
}

func startBenchServer(b *testing.B, bin, dir string) *benchServer {
	b.Helper()
	s := &benchServer{tokensFile: filepath.Join(dir, "tokens.json")}
	s.cmd = exec.Command(bin, "-addr", "127.0.0.1:0", "-db", "sqlite:"+filepath.Join(dir, "nodelane.db"),
		"-secrets-file", filepath.Join(dir, "secrets.json"), "-tokens-file", s.tokensFile)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	s.cmd.Stdout = io.Discard
	if err := s.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		s.cmd.Process.Signal(os.Interrupt)
		s.cmd.Wait()
	})
	addrs := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg=serving addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1]
			}
		}
	}()
	select {
	case s.addr = <-addrs:
	case <-time.After(startTimeout):
		b.Fatal("the server did not start")
	}
	return s
}

func (s *benchServer) tokens(b *testing.B) controlplane.Tokens {
	b.Helper()
	raw, err := os.ReadFile(s.tokensFile)
	if err != nil {
		b.Fatal(err)
	}
	var t controlplane.Tokens
	if err := json.Unmarshal(raw, &t); err != nil {
		b.Fatal(err)
	}
	return t
}

// rss returns the server's resident memory, in bytes.
func (s *benchServer) rss() (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(raw) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", s.cmd.Process.Pid)
}

// peak samples the server's RSS until stopped.
type peak struct {
	done chan struct{}
	wg   sync.WaitGroup
	max  int64
}

func newPeak(s *benchServer) *peak {
	p := &peak{done: make(chan struct{})}
	p.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if n, err := s.rss(); err == nil {
				p.max = max(p.max, n)
			}
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
		}
	})
	return p
}

func (p *peak) stop() int64 {
	close(p.done)
	p.wg.Wait()
	return p.max
}
