package workerapi

import (
	"context"
	"errors"
	"io"
	"iter"
	"net/http"
	"time"
)

// ErrObjectNotFound means an ArtifactStore holds no object under a key.
var ErrObjectNotFound = errors.New("workerapi: no such object")

// ArtifactStore keeps the bytes of artifacts as objects under keys the
// Server chooses ("jobs/<job id>/<upload>/<part>"). The module
// github.com/nodelane/nodelane/blobstore implements it on a
// gocloud.dev/blob bucket (file://, s3://, gs://, azblob://); a host may
// implement it on anything that stores objects whole.
//
// The Server writes each object once and reads it back by ranges; it
// never appends. Every method is called concurrently, and keys contain
// only letters, digits, '_', '-', '.' and '/'.
type ArtifactStore interface {
	// Put stores the bytes r gives under key, with metadata (at most a
	// few hundred bytes, returned by Stat), replacing any object under
	// key. It returns once the object is stored whole; if it returns an
	// error, or ctx is canceled before it returns, no object (and no part
	// of one) is left under key by this call.
	Put(ctx context.Context, key string, r io.Reader, metadata map[string]string) error
	// Open returns length bytes of the object from offset (length < 0:
	// to its end). ErrObjectNotFound if there is no object under key.
	Open(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)
	// Stat describes the object under key, or returns ErrObjectNotFound.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Delete removes the object under key; a missing object is no error.
	Delete(ctx context.Context, key string) error
	// List yields the objects whose keys start with prefix, in key order.
	List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error]
}

// ObjectInfo describes an object of an ArtifactStore.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
	// Metadata is what Put stored with the object; nil from List.
	Metadata map[string]string
}

// ArtifactPresigner is an ArtifactStore whose objects a worker can write
// and read directly, by URLs the Server hands it (an S3 bucket's
// presigned URLs): the bytes then never pass through the control plane.
// The Server checks what a worker wrote by reading it back.
type ArtifactPresigner interface {
	ArtifactStore
	// PresignPut returns a URL a worker may PUT the bytes of key to until
	// expiry, with the headers it must send.
	PresignPut(ctx context.Context, key string, expiry time.Duration) (url string, header http.Header, err error)
	// PresignGet returns a URL a worker may GET the object under key from
	// until expiry.
	PresignGet(ctx context.Context, key string, expiry time.Duration) (url string, err error)
}
