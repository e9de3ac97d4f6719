package blobstore_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkFilePut stores 64 MiB objects (one upload part) in a file://
// store: the store's share of an upload's cost (fileblob hashes with MD5
// for its sidecar file as it writes).
//
//	go test -run '^$' -bench FilePut ./blobstore
func BenchmarkFilePut(b *testing.B) {
	const size = 64 << 20
	data := make([]byte, size)
	_, _ = rand.Read(data)
	s := open(b, fileURL(filepath.Join(b.TempDir(), "artifacts")))
	b.SetBytes(size)
	for i := 0; b.Loop(); i++ {
		if err := s.Put(b.Context(), fmt.Sprintf("jobs/j/u/%06d", i%8), bytes.NewReader(data), map[string]string{"a": "b"}); err != nil {
			b.Fatal(err)
		}
	}
}
