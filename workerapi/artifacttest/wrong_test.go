package artifacttest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/wrongstore"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
)

// The control: the memory store passes, so that the wrong stores below
// fail for what is wrong with them.
func TestMemory(t *testing.T) {
	t.Parallel()
	artifacttest.Run(t, func(*testing.T) workerapi.ArtifactStore { return artifacttest.NewMemory() })
}

// The suite must refuse stores that are wrong in the ways real adapters
// are: each variant below passes every test but one. TestWrongStores runs
// the suite on each in a child process and checks that it fails, and
// where.

// wrongEnv names the variant a child process runs the suite on.
const wrongEnv = "ARTIFACTTEST_WRONG_STORE"

var wrongStores = []struct {
	name string
	new  func() workerapi.ArtifactStore
	// fails is the one subtest of Run that must fail.
	fails string
}{
	// Writes as it reads, straight to the object (a file opened in place,
	// an S3 multipart upload completed on error): a cut body leaves a
	// partial part that finish would read.
	{"PartialOnFailure", func() workerapi.ArtifactStore { return partial{artifacttest.NewMemory()} }, "FailedPut"},
	// Ignores its context (a blob.Writer closed without canceling its
	// context first): a canceled upload still stores its bytes.
	{"IgnoresCancel", func() workerapi.ArtifactStore { return uncanceled{artifacttest.NewMemory()} }, "CanceledPut"},
	// Lists as a directory walk does: "jobs/a/1" before "jobs/a-b/1".
	{"DirectoryOrder", func() workerapi.ArtifactStore { return dirOrder{artifacttest.NewMemory()} }, "List"},
	// Returns its driver's not-found error unwrapped.
	{"PlainNotFound", func() workerapi.ArtifactStore { return plainNotFound{artifacttest.NewMemory()} }, "NotFound"},
	// Delete fails on a missing object (a file remove that reports ENOENT).
	{"StrictDelete", func() workerapi.ArtifactStore { return strictDelete{artifacttest.NewMemory()} }, "Delete"},
	// Reads to the end whatever the length asked.
	{"IgnoresLength", func() workerapi.ArtifactStore { return wholeOpen{artifacttest.NewMemory()} }, "Ranges"},
	// Merges a replacement's metadata into the old object's (a sidecar
	// file updated rather than rewritten).
	{"MergedMetadata", func() workerapi.ArtifactStore { return mergedMetadata{artifacttest.NewMemory()} }, "Replace"},
}

func TestWrongStores(t *testing.T) {
	t.Parallel()
	fails := map[string]string{}
	stores := map[string]func() workerapi.ArtifactStore{}
	for _, w := range wrongStores {
		fails[w.name], stores[w.name] = w.fails, w.new
	}
	wrongstore.Check(t, wrongEnv, fails, func(t *testing.T, name string) {
		artifacttest.Run(t, func(*testing.T) workerapi.ArtifactStore { return stores[name]() })
	})
}

// partial stores what it read before its reader failed.
type partial struct{ *artifacttest.Memory }

func (s partial) Put(ctx context.Context, key string, r io.Reader, md map[string]string) error {
	data, err := io.ReadAll(r)
	if err != nil {
		_ = s.Memory.Put(ctx, key, bytes.NewReader(data), md)
		return err
	}
	return s.Memory.Put(ctx, key, bytes.NewReader(data), md)
}

type uncanceled struct{ *artifacttest.Memory }

func (s uncanceled) Put(ctx context.Context, key string, r io.Reader, md map[string]string) error {
	return s.Memory.Put(context.WithoutCancel(ctx), key, r, md)
}

// dirOrder orders keys by their '/'-separated components.
type dirOrder struct{ *artifacttest.Memory }

func (s dirOrder) List(ctx context.Context, prefix string) iter.Seq2[workerapi.ObjectInfo, error] {
	return func(yield func(workerapi.ObjectInfo, error) bool) {
		var infos []workerapi.ObjectInfo
		for info, err := range s.Memory.List(ctx, prefix) {
			if err != nil {
				yield(info, err)
				return
			}
			infos = append(infos, info)
		}
		slices.SortFunc(infos, func(a, b workerapi.ObjectInfo) int {
			return slices.Compare(strings.Split(a.Key, "/"), strings.Split(b.Key, "/"))
		})
		for _, info := range infos {
			if !yield(info, nil) {
				return
			}
		}
	}
}

type plainNotFound struct{ *artifacttest.Memory }

func (s plainNotFound) unwrapped(err error) error {
	if errors.Is(err, workerapi.ErrObjectNotFound) {
		return errors.New("NoSuchKey: the specified key does not exist")
	}
	return err
}

func (s plainNotFound) Open(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	rc, err := s.Memory.Open(ctx, key, offset, length)
	return rc, s.unwrapped(err)
}

func (s plainNotFound) Stat(ctx context.Context, key string) (workerapi.ObjectInfo, error) {
	info, err := s.Memory.Stat(ctx, key)
	return info, s.unwrapped(err)
}

type strictDelete struct{ *artifacttest.Memory }

func (s strictDelete) Delete(ctx context.Context, key string) error {
	if _, err := s.Memory.Stat(ctx, key); err != nil {
		return fmt.Errorf("remove %s: %w", key, err)
	}
	return s.Memory.Delete(ctx, key)
}

type wholeOpen struct{ *artifacttest.Memory }

func (s wholeOpen) Open(ctx context.Context, key string, offset, _ int64) (io.ReadCloser, error) {
	return s.Memory.Open(ctx, key, offset, -1)
}

type mergedMetadata struct{ *artifacttest.Memory }

func (s mergedMetadata) Put(ctx context.Context, key string, r io.Reader, md map[string]string) error {
	merged := map[string]string{}
	if info, err := s.Memory.Stat(ctx, key); err == nil {
		maps.Copy(merged, info.Metadata)
	}
	maps.Copy(merged, md)
	return s.Memory.Put(ctx, key, r, merged)
}
