package artifacttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi"
)

// Memory is a workerapi.ArtifactStore that keeps its objects in memory,
// for tests: it passes the suite, and a test may set its clock. It holds
// every object whole, so it is no store for real artifacts.
type Memory struct {
	// Now is the clock of the objects' ModTime. Defaults to time.Now.
	// Set it before the store is used.
	Now func() time.Time

	mu      sync.Mutex
	objects map[string]memObject
}

type memObject struct {
	data     []byte
	modTime  time.Time
	metadata map[string]string
}

// NewMemory returns an empty Memory store.
func NewMemory() *Memory {
	return &Memory{objects: map[string]memObject{}}
}

func (m *Memory) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// ctxReader fails with ctx's error once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// Put implements workerapi.ArtifactStore: it reads r whole, then stores
// the object unless r failed or ctx is done.
func (m *Memory) Put(ctx context.Context, key string, r io.Reader, metadata map[string]string) error {
	data, err := io.ReadAll(ctxReader{ctx, r})
	if err != nil {
		return fmt.Errorf("artifacttest: put %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("artifacttest: put %s: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objects[key] = memObject{data: data, modTime: m.now(), metadata: maps.Clone(metadata)}
	return nil
}

func (m *Memory) get(key string) (memObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	if !ok {
		return memObject{}, fmt.Errorf("artifacttest: %s: %w", key, workerapi.ErrObjectNotFound)
	}
	return o, nil
}

// Open implements workerapi.ArtifactStore.
func (m *Memory) Open(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	o, err := m.get(key)
	if err != nil {
		return nil, err
	}
	size := int64(len(o.data))
	if offset < 0 || offset > size {
		return nil, fmt.Errorf("artifacttest: open %s: offset %d outside 0..%d", key, offset, size)
	}
	end := size
	if length >= 0 {
		end = min(size, offset+length)
	}
	return io.NopCloser(bytes.NewReader(o.data[offset:end])), nil
}

// Stat implements workerapi.ArtifactStore.
func (m *Memory) Stat(ctx context.Context, key string) (workerapi.ObjectInfo, error) {
	o, err := m.get(key)
	if err != nil {
		return workerapi.ObjectInfo{}, err
	}
	return workerapi.ObjectInfo{Key: key, Size: int64(len(o.data)), ModTime: o.modTime, Metadata: maps.Clone(o.metadata)}, nil
}

// Delete implements workerapi.ArtifactStore.
func (m *Memory) Delete(ctx context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objects, key)
	return nil
}

// List implements workerapi.ArtifactStore. It yields the objects as they
// were when the iteration began.
func (m *Memory) List(ctx context.Context, prefix string) iter.Seq2[workerapi.ObjectInfo, error] {
	return func(yield func(workerapi.ObjectInfo, error) bool) {
		m.mu.Lock()
		var infos []workerapi.ObjectInfo
		for k, o := range m.objects {
			if strings.HasPrefix(k, prefix) {
				infos = append(infos, workerapi.ObjectInfo{Key: k, Size: int64(len(o.data)), ModTime: o.modTime})
			}
		}
		m.mu.Unlock()
		slices.SortFunc(infos, func(a, b workerapi.ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
		for _, info := range infos {
			if err := ctx.Err(); err != nil {
				yield(workerapi.ObjectInfo{}, err)
				return
			}
			if !yield(info, nil) {
				return
			}
		}
	}
}

var _ workerapi.ArtifactStore = (*Memory)(nil)
