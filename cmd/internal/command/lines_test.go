package command

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, line string
		progress   bool
		artifact   bool
		wantErr    string
	}{
		{"plain", "epoch 1 loss 0.3", false, false, ""},
		{"prefix word", "nodelane:progressbar 50%", false, false, ""},
		{"progress", `nodelane:progress {"fraction": 0.5, "message": "half", "metrics": {"loss": 0.2}}`, true, false, ""},
		{"progress no fraction", `nodelane:progress {"message": "warming up"}`, true, false, ""},
		{"progress fraction over 1", `nodelane:progress {"fraction": 1.5}`, false, false, "between 0 and 1"},
		{"progress negative", `nodelane:progress {"fraction": -0.1}`, false, false, "between 0 and 1"},
		{"progress bad json", `nodelane:progress {"fraction": }`, false, false, "bad JSON"},
		{"progress unknown field", `nodelane:progress {"fracton": 0.5}`, false, false, "bad JSON"},
		{"progress trailing", `nodelane:progress {"fraction": 0.5} x`, false, false, "text after"},
		{"progress metrics not object", `nodelane:progress {"metrics": [1]}`, false, false, "not a JSON object"},
		{"progress empty", `nodelane:progress`, false, false, "bad JSON"},
		{"artifact", `nodelane:artifact {"name": "adapter", "path": "adapter/model.safetensors", "kind": "adapter"}`, false, true, ""},
		{"artifact no path", `nodelane:artifact {"name": "x"}`, false, false, "path is required"},
		{"artifact dotdot", `nodelane:artifact {"path": "../secret"}`, false, false, "not a relative path"},
		{"artifact inner dotdot", `nodelane:artifact {"path": "a/../../secret"}`, false, false, "not a relative path"},
		{"artifact absolute", `nodelane:artifact {"path": "/etc/passwd"}`, false, false, "not a relative path"},
		{"artifact long name", `nodelane:artifact {"path": "a", "name": "` + strings.Repeat("n", 256) + `"}`, false, false, "at most 255"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, a, err := ParseLine(tc.line)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || (p != nil) != tc.progress || (a != nil) != tc.artifact {
				t.Fatalf("progress %v artifact %v err %v", p, a, err)
			}
		})
	}
	_, a, _ := ParseLine(`nodelane:artifact {"path": "out/w.bin"}`)
	if a.Name != "w.bin" || a.Kind != "file" {
		t.Errorf("artifact defaults: %+v", a)
	}
}

func TestReadLines(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 40) // 80 bytes
	in := "a\r\nb\n\n" + long + "\nlast"
	var got []string
	var cut []bool
	if err := readLines(strings.NewReader(in), 51, func(l string, tr bool) { got = append(got, l); cut = append(cut, tr) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || got[0] != "a" || got[1] != "b" || got[2] != "" || got[4] != "last" {
		t.Fatalf("lines %q", got)
	}
	if !cut[3] || got[3] != strings.Repeat("é", 25) || cut[4] {
		t.Errorf("cut line %q (%t), want 25 runes, the split one dropped", got[3], cut[3])
	}
	// A line longer than the reader's buffer.
	got = nil
	huge := strings.Repeat("x", 200<<10)
	if err := readLines(strings.NewReader(huge+"\nnext\n"), MaxLineBytes, func(l string, tr bool) { got = append(got, l) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[0]) != MaxLineBytes || got[1] != "next" {
		t.Errorf("huge line: %d lines, first %d bytes", len(got), len(got[0]))
	}
}

func TestBucket(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	b := newBucket(10, 5, func() time.Time { return now })
	for i := range 5 {
		if ok, _ := b.take(); !ok {
			t.Fatalf("line %d refused within the burst", i)
		}
	}
	for range 3 {
		if ok, _ := b.take(); ok {
			t.Fatal("line over the burst taken")
		}
	}
	now = now.Add(100 * time.Millisecond)
	if ok, dropped := b.take(); !ok || dropped != 3 {
		t.Fatalf("after a token: %t, dropped %d, want 3", ok, dropped)
	}
	if ok, _ := b.take(); ok {
		t.Fatal("second line with one token")
	}
	if d := b.flush(); d != 1 {
		t.Errorf("flush %d", d)
	}
}

func TestDevices(t *testing.T) {
	t.Parallel()
	if _, err := NewDevices([]string{"0", "0"}); err == nil {
		t.Error("duplicate ids accepted")
	}
	if _, err := NewDevices([]string{"0,1"}); err == nil {
		t.Error("id with a comma accepted")
	}
	d, err := NewDevices([]string{"0", "1", "2", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(context.Background(), 5); err == nil {
		t.Error("5 of 4 GPUs granted")
	}
	// No overlap under concurrency: every holder marks its devices.
	var mu sync.Mutex
	held := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := i%3 + 1
			ids, err := d.Acquire(context.Background(), n)
			if err != nil || len(ids) != n {
				errs <- "acquire failed"
				return
			}
			mu.Lock()
			for _, id := range ids {
				if held[id] {
					errs <- "device " + id + " handed out twice"
				}
				held[id] = true
			}
			mu.Unlock()
			// Held a moment, so that the holders overlap: the contention
			// is what the test is about.
			time.Sleep(time.Millisecond)
			mu.Lock()
			for _, id := range ids {
				held[id] = false
			}
			mu.Unlock()
			d.Release(ids)
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	// Waiting is bounded by the context.
	all, _ := d.Acquire(context.Background(), 4)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.Acquire(ctx, 1); err == nil {
		t.Error("a device granted while all are held")
	}
	none, err := d.Acquire(context.Background(), 0)
	if err != nil || len(none) != 0 {
		t.Errorf("0 GPUs: %v %v", none, err)
	}
	got := make(chan []string)
	go func() {
		ids, _ := d.Acquire(context.Background(), 2)
		got <- ids
	}()
	d.Release(all[:2])
	if ids := <-got; len(ids) != 2 {
		t.Errorf("after release: %v", ids)
	}
}

func TestQueue(t *testing.T) {
	t.Parallel()
	q := newQueue()
	f := func(v float64) event { return event{p: &Progress{Fraction: &v}} }
	for i := range maxPendingProgress + 10 {
		q.push(f(float64(i) / 1000))
	}
	q.push(event{a: &Artifact{Path: "a"}})
	q.push(f(0.9))
	q.close()
	var got []event
	for {
		ev, ok := q.next(context.Background())
		if !ok {
			break
		}
		got = append(got, ev)
	}
	if len(got) != maxPendingProgress+2 {
		t.Fatalf("%d events, want %d", len(got), maxPendingProgress+2)
	}
	if last := *got[maxPendingProgress-1].p.Fraction; last != float64(maxPendingProgress+9)/1000 {
		t.Errorf("the newest waiting progress is %v, want the last pushed", last)
	}
	if got[maxPendingProgress].a == nil || *got[maxPendingProgress+1].p.Fraction != 0.9 {
		t.Error("order lost")
	}
	for range MaxArtifacts {
		q.push(event{a: &Artifact{Path: "a"}})
	}
	if q.push(event{a: &Artifact{Path: "a"}}) {
		t.Error("an artifact over MaxArtifacts taken")
	}
}
