// Package artifacttest is the conformance suite that every
// workerapi.ArtifactStore must pass, and a memory store for tests. An
// adapter's test calls Run with a function that returns a new, empty
// store:
//
//	func TestArtifactStore(t *testing.T) {
//		artifacttest.Run(t, func(t *testing.T) workerapi.ArtifactStore { return newEmptyStore(t) })
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a directory, a
// bucket or a key prefix of its own), so that no test sees another's
// objects.
//
// The suite checks what the Server relies on: bytes read back whole and
// by ranges (a length of -1 reads to the end, an offset at the end reads
// nothing), metadata kept by Stat, ErrObjectNotFound (through errors.Is)
// from Open and Stat, an idempotent Delete, List in byte order of keys
// under a prefix, a Put that replaces, and — what the upload routes
// depend on — a Put whose reader fails, or whose context is canceled,
// leaves no object. Metadata keys are lowercase letters, digits and '-'
// (S3 folds the case of keys), values printable ASCII.
//
// The suite's own test, wrong_test.go, runs it on stores that are wrong
// in one way each and checks that it fails each in the test that names
// the mistake.
package artifacttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi"
)

// Run runs the conformance suite against stores made by newStore. Each
// test gets its own store and runs in parallel with the others, so
// newStore is called concurrently and must return independent stores.
func Run(t *testing.T, newStore func(t *testing.T) workerapi.ArtifactStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"PutOpen", testPutOpen},
		{"Ranges", testRanges},
		{"Stat", testStat},
		{"NotFound", testNotFound},
		{"Delete", testDelete},
		{"Replace", testReplace},
		{"List", testList},
		{"FailedPut", testFailedPut},
		{"CanceledPut", testCanceledPut},
		{"ConcurrentPuts", testConcurrentPuts},
		{"Keys", testKeys},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, &fixture{t: t, ctx: t.Context(), s: newStore(t)})
		})
	}
}

type fixture struct {
	t   *testing.T
	ctx context.Context
	s   workerapi.ArtifactStore
}

// put stores data under key, failing the test on an error.
func (f *fixture) put(key string, data []byte, md map[string]string) {
	f.t.Helper()
	if err := f.s.Put(f.ctx, key, bytes.NewReader(data), md); err != nil {
		f.t.Fatalf("Put(%q, %d bytes): %v", key, len(data), err)
	}
}

// read returns Open(key, offset, length) read whole.
func (f *fixture) read(key string, offset, length int64) []byte {
	f.t.Helper()
	rc, err := f.s.Open(f.ctx, key, offset, length)
	if err != nil {
		f.t.Fatalf("Open(%q, %d, %d): %v", key, offset, length, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		f.t.Fatalf("reading Open(%q, %d, %d): %v", key, offset, length, err)
	}
	if err := rc.Close(); err != nil {
		f.t.Fatalf("closing Open(%q, %d, %d): %v", key, offset, length, err)
	}
	return b
}

// same fails the test unless the object under key holds want.
func (f *fixture) same(key string, want []byte) {
	f.t.Helper()
	if got := f.read(key, 0, -1); !bytes.Equal(got, want) {
		f.t.Fatalf("object %q holds %d bytes %s, want %d bytes %s", key, len(got), brief(got), len(want), brief(want))
	}
}

// keys returns the keys List(prefix) yields, in its order.
func (f *fixture) keys(prefix string) []string {
	f.t.Helper()
	var out []string
	for info, err := range f.s.List(f.ctx, prefix) {
		if err != nil {
			f.t.Fatalf("List(%q): %v", prefix, err)
		}
		out = append(out, info.Key)
	}
	return out
}

// absent fails the test if an object, whole or partial, is under key:
// Stat must fail and List must not show it. (NotFound checks the error.)
func (f *fixture) absent(what, key string) {
	f.t.Helper()
	if info, err := f.s.Stat(f.ctx, key); err == nil {
		f.t.Fatalf("%s: an object of %d bytes is under %q, want none", what, info.Size, key)
	}
	if ks := f.keys(key); len(ks) != 0 {
		f.t.Fatalf("%s: List(%q) = %q, want nothing", what, key, ks)
	}
}

// random returns n pseudo-random bytes, different for each seed.
func random(seed uint64, n int) []byte {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 1})
	b := make([]byte, n)
	_, _ = r.Read(b)
	return b
}

// brief shows at most the first 16 bytes of b.
func brief(b []byte) string {
	if len(b) > 16 {
		return fmt.Sprintf("%q...", b[:16])
	}
	return fmt.Sprintf("%q", b)
}

// big is larger than S3's smallest multipart part (5 MiB), so a store
// that uploads in parts writes several.
const big = 12<<20 + 12345

func testPutOpen(t *testing.T, f *fixture) {
	f.put("small", []byte("hello, artifact"), nil)
	f.same("small", []byte("hello, artifact"))
	// A 0-byte artifact is one 0-byte part.
	f.put("empty", nil, nil)
	f.same("empty", []byte{})
	if info, err := f.s.Stat(f.ctx, "empty"); err != nil || info.Size != 0 {
		t.Fatalf("Stat(empty) = %+v, %v; want size 0", info, err)
	}
	data := random(1, big)
	f.put("big", data, nil)
	f.same("big", data)
	if info, err := f.s.Stat(f.ctx, "big"); err != nil || info.Size != big {
		t.Fatalf("Stat(big) = %+v, %v; want size %d", info, err, big)
	}
}

func testRanges(t *testing.T, f *fixture) {
	data := random(2, 6<<20+7)
	size := int64(len(data))
	f.put("obj", data, nil)
	tests := []struct {
		name           string
		offset, length int64
		want           []byte
	}{
		{"whole", 0, -1, data},
		{"whole by length", 0, size, data},
		{"head", 0, 10, data[:10]},
		{"middle", 5<<20 - 3, 1<<20 + 5, data[5<<20-3 : 6<<20+2]},
		{"tail", size - 100, -1, data[size-100:]},
		{"tail by length", size - 100, 100, data[size-100:]},
		{"last byte", size - 1, 1, data[size-1:]},
		{"offset at end", size, -1, nil},
		{"offset at end, length 0", size, 0, nil},
		{"length 0", 10, 0, nil},
	}
	for _, tc := range tests {
		got := f.read("obj", tc.offset, tc.length)
		if !bytes.Equal(got, tc.want) {
			t.Errorf("%s: Open(obj, %d, %d) gave %d bytes %s, want %d bytes %s",
				tc.name, tc.offset, tc.length, len(got), brief(got), len(tc.want), brief(tc.want))
		}
	}
	f.put("empty", nil, nil)
	if got := f.read("empty", 0, -1); len(got) != 0 {
		t.Errorf("Open(empty, 0, -1) gave %d bytes", len(got))
	}
}

func testStat(t *testing.T, f *fixture) {
	md := map[string]string{
		"sha256-in":  "c2hhAwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA+/=",
		"sha256-out": "0123456789abcdef",
		"part":       "3",
	}
	before := time.Now()
	f.put("jobs/job_1/up/000001", []byte("twelve bytes"), md)
	after := time.Now()
	info, err := f.s.Stat(f.ctx, "jobs/job_1/up/000001")
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if info.Key != "jobs/job_1/up/000001" || info.Size != 12 {
		t.Errorf("Stat = %+v, want key jobs/job_1/up/000001, size 12", info)
	}
	if !maps.Equal(info.Metadata, md) {
		t.Errorf("Stat metadata = %v, want %v", info.Metadata, md)
	}
	// The sweep compares ModTime with the Server's clock: it must be the
	// time of the Put, give or take the resolution of a file system and
	// the skew of a server on the same host.
	if slack := 2 * time.Second; info.ModTime.Before(before.Add(-slack)) || info.ModTime.After(after.Add(slack)) {
		t.Errorf("Stat ModTime = %v, want between %v and %v", info.ModTime, before, after)
	}
	f.put("bare", []byte("x"), nil)
	if info, err := f.s.Stat(f.ctx, "bare"); err != nil || len(info.Metadata) != 0 {
		t.Errorf("Stat(bare) = %+v, %v; want no metadata", info, err)
	}
	// The store keeps its own copy: changing the map after Put changes nothing.
	given := map[string]string{"k": "v"}
	f.put("copied", []byte("x"), given)
	given["k"] = "changed"
	if info, err := f.s.Stat(f.ctx, "copied"); err != nil || info.Metadata["k"] != "v" {
		t.Errorf("Stat(copied) = %+v, %v; want metadata k=v", info, err)
	}
}

func testNotFound(t *testing.T, f *fixture) {
	check := func(what, key string) {
		t.Helper()
		if rc, err := f.s.Open(f.ctx, key, 0, -1); !errors.Is(err, workerapi.ErrObjectNotFound) {
			if err == nil {
				rc.Close()
			}
			t.Errorf("%s: Open(%q) = %v, want ErrObjectNotFound", what, key, err)
		}
		if rc, err := f.s.Open(f.ctx, key, 5, 10); !errors.Is(err, workerapi.ErrObjectNotFound) {
			if err == nil {
				rc.Close()
			}
			t.Errorf("%s: Open(%q, 5, 10) = %v, want ErrObjectNotFound", what, key, err)
		}
		if _, err := f.s.Stat(f.ctx, key); !errors.Is(err, workerapi.ErrObjectNotFound) {
			t.Errorf("%s: Stat(%q) = %v, want ErrObjectNotFound", what, key, err)
		}
	}
	check("never stored", "jobs/none/000001")
	f.put("jobs/j/u/000001", []byte("bytes"), nil)
	check("a prefix of a key", "jobs/j/u/")
	check("a prefix of a key without its slash", "jobs/j/u")
	f.put("gone", []byte("bytes"), nil)
	if err := f.s.Delete(f.ctx, "gone"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	check("deleted", "gone")
}

func testDelete(t *testing.T, f *fixture) {
	f.put("jobs/a/1", []byte("one"), nil)
	f.put("jobs/a/2", []byte("two"), nil)
	if err := f.s.Delete(f.ctx, "jobs/a/1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := f.s.Delete(f.ctx, "jobs/a/1"); err != nil {
		t.Errorf("Delete of a deleted object: %v, want nil", err)
	}
	if err := f.s.Delete(f.ctx, "never/stored"); err != nil {
		t.Errorf("Delete of an object never stored: %v, want nil", err)
	}
	if ks := f.keys("jobs/"); !slices.Equal(ks, []string{"jobs/a/2"}) {
		t.Errorf("after Delete, List(jobs/) = %q, want [jobs/a/2]", ks)
	}
	f.same("jobs/a/2", []byte("two"))
}

func testReplace(t *testing.T, f *fixture) {
	long := random(3, 1<<20)
	f.put("k", long, map[string]string{"a": "1", "b": "2"})
	f.put("k", []byte("short"), map[string]string{"c": "3"})
	f.same("k", []byte("short"))
	info, err := f.s.Stat(f.ctx, "k")
	if err != nil || info.Size != 5 || !maps.Equal(info.Metadata, map[string]string{"c": "3"}) {
		t.Errorf("Stat after replacing = %+v, %v; want size 5, metadata only c=3", info, err)
	}
	if ks := f.keys(""); !slices.Equal(ks, []string{"k"}) {
		t.Errorf("List after replacing = %q, want [k]", ks)
	}
}

func testList(t *testing.T, f *fixture) {
	// In byte order '-' and '.' come before '/', so a store that walks
	// directories ("jobs/a/" before "jobs/a-b/") lists out of order.
	stored := []string{
		"jobs/a/2", "jobs/ab/1", "jobs/a-b/1", "other/1", "jobs/a/1", "jobs/A/1",
		"jobs/a.b", "jobsx", "jobs/a/10", "jobs/a_b/1", "jobs/0/1",
	}
	sizes := map[string]int64{}
	for i, k := range stored {
		data := random(uint64(10+i), 10+i)
		f.put(k, data, map[string]string{"n": fmt.Sprint(i)})
		sizes[k] = int64(len(data))
	}
	byPrefix := func(p string) []string {
		var out []string
		for _, k := range stored {
			if strings.HasPrefix(k, p) {
				out = append(out, k)
			}
		}
		slices.Sort(out)
		return out
	}
	for _, prefix := range []string{"", "jobs/", "jobs", "jobs/a", "jobs/a/", "jobs/a/1", "jobs/a-", "other/", "none/", "jobs/b"} {
		want := byPrefix(prefix)
		var got []string
		for info, err := range f.s.List(f.ctx, prefix) {
			if err != nil {
				t.Fatalf("List(%q): %v", prefix, err)
			}
			got = append(got, info.Key)
			if info.Size != sizes[info.Key] {
				t.Errorf("List(%q) gives %q size %d, want %d", prefix, info.Key, info.Size, sizes[info.Key])
			}
			if info.ModTime.IsZero() {
				t.Errorf("List(%q) gives %q no ModTime", prefix, info.Key)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("List(%q) = %q, want %q", prefix, got, want)
		}
	}
	// A consumer that stops early stops the iteration (range over a
	// function that yields after false panics).
	n := 0
	for _, err := range f.s.List(f.ctx, "jobs/") {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 2 {
			break
		}
	}
	if n != 2 {
		t.Errorf("List(jobs/) stopped after %d objects, want 2", n)
	}
}

// errCut is the error of a reader cut before its end, as a body whose
// digest does not match or whose connection drops.
var errCut = errors.New("artifacttest: body cut")

// cutReader gives n bytes of data, then fails with errCut.
type cutReader struct {
	data []byte
	n    int
}

func (r *cutReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errCut
	}
	k := copy(p[:min(len(p), r.n)], r.data)
	r.data, r.n = r.data[k:], r.n-k
	return k, nil
}

func testFailedPut(t *testing.T, f *fixture) {
	for _, n := range []int{0, 1000, big - 1} {
		key := fmt.Sprintf("jobs/j/u/%06d", n)
		err := f.s.Put(f.ctx, key, &cutReader{data: random(4, big), n: n}, map[string]string{"m": "1"})
		if !errors.Is(err, errCut) {
			t.Fatalf("Put of a reader that fails after %d bytes = %v, want its error", n, err)
		}
		f.absent(fmt.Sprintf("a reader that fails after %d bytes", n), key)
	}
	// A failed replacement leaves the object it would have replaced, or
	// nothing; never a part of the new one.
	old := []byte("the old bytes")
	f.put("jobs/j/u/replaced", old, nil)
	err := f.s.Put(f.ctx, "jobs/j/u/replaced", &cutReader{data: random(5, 1<<20), n: 1 << 19}, nil)
	if !errors.Is(err, errCut) {
		t.Fatalf("Put of a failing replacement = %v, want its error", err)
	}
	if info, err := f.s.Stat(f.ctx, "jobs/j/u/replaced"); err == nil {
		if info.Size != int64(len(old)) {
			t.Fatalf("after a failed replacement the object has %d bytes, want the old %d or none", info.Size, len(old))
		}
		f.same("jobs/j/u/replaced", old)
	}
}

// cancelingReader gives data, calling cancel once after the first half.
type cancelingReader struct {
	data   []byte
	half   int
	cancel context.CancelFunc
	read   int
}

func (r *cancelingReader) Read(p []byte) (int, error) {
	if r.read >= r.half {
		r.cancel()
	}
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	k := copy(p, r.data)
	r.data = r.data[k:]
	r.read += k
	return k, nil
}

func testCanceledPut(t *testing.T, f *fixture) {
	// The reader ends well after the cancel: only the context says the
	// Put must not count.
	for _, size := range []int{100, big} {
		ctx, cancel := context.WithCancel(f.ctx)
		key := fmt.Sprintf("jobs/j/u/%06d", size)
		err := f.s.Put(ctx, key, &cancelingReader{data: random(6, size), half: size / 2, cancel: cancel}, nil)
		cancel()
		if err == nil {
			t.Fatalf("Put of %d bytes whose context was canceled midway returned nil", size)
		}
		f.absent(fmt.Sprintf("a Put of %d bytes canceled midway", size), key)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	if err := f.s.Put(ctx, "jobs/j/u/before", bytes.NewReader([]byte("bytes")), nil); err == nil {
		t.Fatal("Put with a canceled context returned nil")
	}
	f.absent("a Put with a canceled context", "jobs/j/u/before")
}

func testConcurrentPuts(t *testing.T, f *fixture) {
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprintf("jobs/j/u/%06d", i+1)
			errs[i] = f.s.Put(f.ctx, key, bytes.NewReader(random(uint64(100+i), 256<<10+i)), map[string]string{"i": fmt.Sprint(i)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	var want []string
	for i := range n {
		key := fmt.Sprintf("jobs/j/u/%06d", i+1)
		want = append(want, key)
		f.same(key, random(uint64(100+i), 256<<10+i))
		if info, err := f.s.Stat(f.ctx, key); err != nil || info.Metadata["i"] != fmt.Sprint(i) {
			t.Errorf("Stat(%q) = %+v, %v; want metadata i=%d", key, info, err, i)
		}
	}
	if got := f.keys("jobs/j/u/"); !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q", got, want)
	}
}

func testKeys(t *testing.T, f *fixture) {
	// Every character the Server's keys may hold, and several levels of '/'.
	keys := []string{
		"jobs/job_01J9ZK-abc.def/0123456789abcdef0123456789abcdef/000001",
		"jobs/job_01J9ZK-abc.def/0123456789abcdef0123456789abcdef/000002",
		"a/b/c/d/e/f/g",
		"Z_z-9.0",
	}
	for i, k := range keys {
		f.put(k, []byte(k), map[string]string{"i": fmt.Sprint(i)})
	}
	for _, k := range keys {
		f.same(k, []byte(k))
		if info, err := f.s.Stat(f.ctx, k); err != nil || info.Key != k || info.Size != int64(len(k)) {
			t.Errorf("Stat(%q) = %+v, %v", k, info, err)
		}
	}
	want := slices.Sorted(slices.Values(keys))
	if got := f.keys(""); !slices.Equal(got, want) {
		t.Errorf("List() = %q, want %q", got, want)
	}
	if got := f.keys("jobs/job_01J9ZK-abc.def/"); !slices.Equal(got, keys[:2]) {
		t.Errorf("List(jobs/job_01J9ZK-abc.def/) = %q, want %q", got, keys[:2])
	}
}
