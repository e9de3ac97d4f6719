// Package blobstore keeps nodelane's artifact bytes in a gocloud.dev/blob
// bucket: a local directory (file://), S3 or an S3-compatible server such
// as MinIO or versitygw (s3://), Google Cloud Storage (gs://), Azure Blob
// Storage (azblob://), or memory (mem://, for tests). It is a module of
// its own (github.com/nodelane/nodelane/blobstore), so that the library,
// which declares the small workerapi.ArtifactStore interface, never
// requires gocloud.dev and the cloud SDKs behind it.
//
// A host opens a store by URL and hands it to the Server:
//
//	store, bucket, err := blobstore.Open(ctx, "s3://artifacts?region=eu-west-1")
//	if err != nil { ... }
//	defer bucket.Close()
//	cfg.Artifacts.Store = store
//
// or wraps a bucket it opened itself with New. When the bucket can sign
// URLs (S3, GCS with a signing identity, Azure with a shared key), the
// store New returns is a workerapi.ArtifactPresigner, and workers send
// their bytes straight to the bucket; otherwise it is only a
// workerapi.ArtifactStore, and the bytes stream through the control
// plane. Either passes the conformance suite workerapi/artifacttest.
package blobstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/memblob"
	"gocloud.dev/gcerrors"

	// The drivers Open reaches through gocloud's URL mux.
	_ "gocloud.dev/blob/azureblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"

	"github.com/nodelane/nodelane/workerapi"
)

// ContentType is the Content-Type of every object the Store writes, and
// the header a worker sends with a presigned PUT.
const ContentType = "application/octet-stream"

// walkPage is the page of a file:// store's listing of one level.
const walkPage = 1 << 16

// probeTimeout bounds New's trial of the bucket's URL signing, which
// some drivers (GCS without a private key) do over the network.
const probeTimeout = 30 * time.Second

// Options tunes a Store. The zero value is the usual choice.
type Options struct {
	// NoPresign makes New return a store that is no
	// workerapi.ArtifactPresigner even when the bucket signs URLs: the
	// bytes then always pass through the control plane (a bucket the
	// workers cannot reach). workerapi.ArtifactConfig.NoPresign does the
	// same from the Server's side.
	NoPresign bool
	// BufferSize is the blob.Writer's buffer, the size of one part of an
	// S3 multipart upload. Defaults to the driver's (5 MiB for S3).
	BufferSize int
}

// Store is a workerapi.ArtifactStore on a blob.Bucket.
//
// Put writes through a blob.Writer and, if the reader fails or the
// context ends first, cancels the writer's context before closing it, so
// that the driver aborts the object: a file:// bucket removes its
// temporary file, S3 aborts the multipart upload. On a file:// bucket,
// a Put in progress shows in List as a temporary object
// ("<key>.<hex>.tmp") next to its key; one that a crash left behind is
// under its upload's prefix, which the Server's sweep deletes.
type Store struct {
	b *blob.Bucket
	o Options
	// walk: the bucket lists in directory order (fileblob), so List sorts
	// each level itself.
	walk bool
	// root is the directory of a file:// store Open opened, whose empty
	// directories Delete removes.
	root string
}

// PresigningStore is a Store whose bucket signs URLs: a
// workerapi.ArtifactPresigner.
type PresigningStore struct {
	*Store
}

var (
	_ workerapi.ArtifactStore     = (*Store)(nil)
	_ workerapi.ArtifactPresigner = PresigningStore{}
)

// New returns a store on b: a PresigningStore if b signs a URL (New tries
// one, and o.NoPresign is false), else a *Store. The caller keeps b and
// closes it after the store's last use. The bucket must keep metadata (a
// fileblob bucket not opened with metadata=skip). A file:// store Open
// opens is faster than New on a fileblob bucket: it writes the metadata
// sidecar without fileblob's MD5 of every byte.
func New(b *blob.Bucket, o Options) workerapi.ArtifactStore {
	var fi os.FileInfo
	s := &Store{b: b, o: o, walk: b.As(&fi)}
	if o.NoPresign {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	if _, err := b.SignedURL(ctx, "nodelane-presign-probe", &blob.SignedURLOptions{Method: http.MethodPut, Expiry: time.Minute}); err != nil {
		return s
	}
	return PresigningStore{s}
}

// Open opens the bucket that url names and returns New's store on it,
// and the bucket, which the caller closes after the store's last use.
//
//   - file:///abs/dir, or file://./rel/dir relative to the working
//     directory: a directory, created 0700 with its parents if missing;
//     its subdirectories are created 0700 too. Each object's metadata is
//     in a sidecar file "<key>.attrs" (List never shows those). The URL
//     takes no query parameters.
//   - s3://bucket?region=…&endpoint=…&use_path_style=true: S3 or an
//     S3-compatible server, with the parameters gocloud.dev/blob/s3blob
//     documents; credentials come from the AWS SDK's usual sources
//     (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, a role).
//     request_checksum_calculation and response_checksum_validation
//     default to when_required (S3-compatible servers differ in the
//     checksums they know; the Server checks sha-256 itself). Presigns.
//   - gs://bucket (gocloud.dev/blob/gcsblob), azblob://container
//     (gocloud.dev/blob/azureblob), with their parameters and
//     credentials.
//   - mem:// : in memory, for tests.
func Open(ctx context.Context, rawURL string, o Options) (workerapi.ArtifactStore, *blob.Bucket, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("blobstore: artifact store URL: %w", err)
	}
	var b *blob.Bucket
	switch u.Scheme {
	case "file":
		dir, err := fileDir(u)
		if err != nil {
			return nil, nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("blobstore: %w", err)
		}
		// MetadataDontWrite: fileblob would hash every byte with MD5 for
		// its sidecar file, the larger part of an upload's cost; Put
		// writes the sidecar itself (sidecar.go).
		b, err = fileblob.OpenBucket(dir, &fileblob.Options{DirFileMode: 0o700, NoTempDir: true, Metadata: fileblob.MetadataDontWrite})
		if err != nil {
			return nil, nil, fmt.Errorf("blobstore: %w", err)
		}
	case "mem":
		b = memblob.OpenBucket(nil)
	case "":
		return nil, nil, fmt.Errorf("blobstore: artifact store %q is no URL (file:///dir, s3://bucket, gs://bucket, azblob://container, mem://)", rawURL)
	case "s3":
		// The AWS SDK validates a response's checksum when the server
		// sends one and logs, on every GET, when it does not (most
		// S3-compatible servers); and it sends new trailing checksums
		// older servers refuse. The bytes' integrity is the Server's
		// sha-256 anyway: ask for checksums only where S3 requires them.
		q := u.Query()
		for _, p := range []string{"request_checksum_calculation", "response_checksum_validation"} {
			if !q.Has(p) {
				q.Set(p, "when_required")
			}
		}
		u.RawQuery = q.Encode()
		b, err = blob.OpenBucket(ctx, u.String())
		if err != nil {
			return nil, nil, fmt.Errorf("blobstore: opening the s3 bucket %q: %w", u.Host, err)
		}
	default:
		b, err = blob.OpenBucket(ctx, rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("blobstore: opening the %s bucket %q: %w", u.Scheme, u.Host, err)
		}
	}
	s := New(b, o)
	if u.Scheme == "file" {
		dir, _ := fileDir(u)
		if root, err := filepath.Abs(dir); err == nil {
			s.(*Store).root = root
		}
	}
	return s, b, nil
}

// fileDir returns the directory of a file:// URL.
func fileDir(u *url.URL) (string, error) {
	if u.RawQuery != "" {
		return "", fmt.Errorf("blobstore: a file:// artifact store takes no query parameters (%q)", u.RawQuery)
	}
	var dir string
	switch u.Host {
	case "", "localhost":
		dir = u.Path
	case ".":
		dir = "." + u.Path
	default:
		return "", fmt.Errorf("blobstore: file://%s: a file URL names a directory of this host (file:///abs/dir or file://./rel/dir)", u.Host)
	}
	if dir == "" || dir == "." {
		return "", errors.New("blobstore: a file:// artifact store needs a directory (file:///abs/dir or file://./rel/dir)")
	}
	return filepath.FromSlash(dir), nil
}

// notFound makes gocloud's not-found errors workerapi.ErrObjectNotFound.
func notFound(op, key string, err error) error {
	if gcerrors.Code(err) == gcerrors.NotFound {
		return fmt.Errorf("blobstore: %s %s: %w", op, key, workerapi.ErrObjectNotFound)
	}
	return fmt.Errorf("blobstore: %s %s: %w", op, key, err)
}

// guardedReader remembers the first error of its reader, and fails once
// ctx is done.
type guardedReader struct {
	ctx context.Context
	r   io.Reader
	err error
}

func (g *guardedReader) Read(p []byte) (int, error) {
	if err := g.ctx.Err(); err != nil {
		g.err = err
		return 0, err
	}
	n, err := g.r.Read(p)
	if err != nil && err != io.EOF {
		g.err = err
	}
	return n, err
}

// Put implements workerapi.ArtifactStore. An error of r, or of ctx, is
// wrapped in the error Put returns.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, metadata map[string]string) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := &blob.WriterOptions{
		ContentType: ContentType,
		Metadata:    metadata,
		BufferSize:  s.o.BufferSize,
	}
	var sc *sidecar
	if s.root != "" {
		sc = &sidecar{root: s.root}
		opts.Metadata, opts.BeforeWrite = nil, sc.beforeWrite
	}
	w, err := s.b.NewWriter(wctx, key, opts)
	if err != nil {
		return fmt.Errorf("blobstore: put %s: %w", key, err)
	}
	g := &guardedReader{ctx: ctx, r: r}
	_, err = io.Copy(w, g)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		// The driver aborts the object when its context ends before Close.
		cancel()
		_ = w.Close()
		if g.err != nil {
			err = g.err
		}
		return fmt.Errorf("blobstore: put %s: %w", key, err)
	}
	if sc != nil {
		if err := sc.write(metadata); err != nil {
			cancel()
			_ = w.Close()
			return fmt.Errorf("blobstore: put %s: %w", key, err)
		}
	}
	if err := w.Close(); err != nil {
		if sc != nil {
			sc.remove()
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("blobstore: put %s: %w", key, err)
	}
	return nil
}

// Open implements workerapi.ArtifactStore.
func (s *Store) Open(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	r, err := s.b.NewRangeReader(ctx, key, offset, length, nil)
	if err == nil {
		return r, nil
	}
	if gcerrors.Code(err) != gcerrors.NotFound && offset > 0 {
		// S3 refuses a range that starts at the end (416); an object of
		// exactly offset bytes has nothing there to read.
		if a, aerr := s.b.Attributes(ctx, key); aerr == nil && a.Size == offset {
			return io.NopCloser(bytes.NewReader(nil)), nil
		}
	}
	return nil, notFound("open", key, err)
}

// Stat implements workerapi.ArtifactStore.
func (s *Store) Stat(ctx context.Context, key string) (workerapi.ObjectInfo, error) {
	a, err := s.b.Attributes(ctx, key)
	if err != nil {
		return workerapi.ObjectInfo{}, notFound("stat", key, err)
	}
	return workerapi.ObjectInfo{Key: key, Size: a.Size, ModTime: a.ModTime, Metadata: a.Metadata}, nil
}

// Delete implements workerapi.ArtifactStore. In a directory Open
// opened (file://), it also removes the directories the object leaves
// empty, so that swept uploads and jobs leave no trace to walk.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.b.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return fmt.Errorf("blobstore: delete %s: %w", key, err)
	}
	if s.root != "" {
		// os.Remove removes only an empty directory: one another Put is
		// writing to stays. (A Put that made its directory just before
		// fails, and its part is sent again.)
		for dir := filepath.Dir(filepath.Join(s.root, filepath.FromSlash(key))); strings.HasPrefix(dir, s.root+string(filepath.Separator)); dir = filepath.Dir(dir) {
			if os.Remove(dir) != nil {
				break
			}
		}
	}
	return nil
}

// List implements workerapi.ArtifactStore. On a bucket that lists in
// byte order (S3, GCS, Azure, memory) it follows the bucket's pages; on a
// file:// bucket, which walks directories ("a/1" before "a-b/1"), it
// lists one directory level at a time and sorts it, holding one level's
// names in memory.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[workerapi.ObjectInfo, error] {
	return func(yield func(workerapi.ObjectInfo, error) bool) {
		if s.walk {
			s.walkLevel(ctx, prefix, yield)
			return
		}
		it := s.b.List(&blob.ListOptions{Prefix: prefix})
		for {
			obj, err := it.Next(ctx)
			if err == io.EOF {
				return
			}
			if err != nil {
				yield(workerapi.ObjectInfo{}, fmt.Errorf("blobstore: list %s: %w", prefix, err))
				return
			}
			if obj.IsDir {
				continue
			}
			if !yield(workerapi.ObjectInfo{Key: obj.Key, Size: obj.Size, ModTime: obj.ModTime}, nil) {
				return
			}
		}
	}
}

// walkLevel yields the objects under prefix, one '/'-level at a time in
// byte order, and reports whether the caller wants more. Everything
// under a directory "a/" shares its prefix, so sorting the level's
// entries (files and directories) and descending in that order yields
// all keys in byte order.
func (s *Store) walkLevel(ctx context.Context, prefix string, yield func(workerapi.ObjectInfo, error) bool) bool {
	// Large pages: fileblob's page token assumes the byte order it does
	// not keep, so a level of more than one page whose names hold '-' or
	// '.' could lose entries at a page's end. (The Server's own names,
	// "job_<hex>", "<hex>", "<digits>", walk in byte order.)
	var entries []*blob.ListObject
	seen := map[string]bool{}
	for token := blob.FirstPageToken; ; {
		page, next, err := s.b.ListPage(ctx, token, walkPage, &blob.ListOptions{Prefix: prefix, Delimiter: "/"})
		if err != nil {
			return yield(workerapi.ObjectInfo{}, fmt.Errorf("blobstore: list %s: %w", prefix, err))
		}
		for _, e := range page {
			if !seen[e.Key] {
				seen[e.Key] = true
				entries = append(entries, e)
			}
		}
		if len(next) == 0 {
			break
		}
		token = next
	}
	slices.SortFunc(entries, func(a, b *blob.ListObject) int { return cmp.Compare(a.Key, b.Key) })
	for _, e := range entries {
		if e.IsDir {
			if !s.walkLevel(ctx, e.Key, yield) {
				return false
			}
			continue
		}
		if !yield(workerapi.ObjectInfo{Key: e.Key, Size: e.Size, ModTime: e.ModTime}, nil) {
			return false
		}
	}
	return true
}

// PresignPut implements workerapi.ArtifactPresigner: a URL to PUT the
// object, and the header Content-Type: application/octet-stream. The
// signature binds the method, the key and the expiry; not the
// Content-Type (gocloud's S3 driver cannot sign one).
func (p PresigningStore) PresignPut(ctx context.Context, key string, expiry time.Duration) (string, http.Header, error) {
	u, err := p.b.SignedURL(ctx, key, &blob.SignedURLOptions{Method: http.MethodPut, Expiry: expiry})
	if err != nil {
		return "", nil, fmt.Errorf("blobstore: presigning a PUT of %s: %w", key, err)
	}
	return u, http.Header{"Content-Type": {ContentType}}, nil
}

// PresignGet implements workerapi.ArtifactPresigner.
func (p PresigningStore) PresignGet(ctx context.Context, key string, expiry time.Duration) (string, error) {
	u, err := p.b.SignedURL(ctx, key, &blob.SignedURLOptions{Method: http.MethodGet, Expiry: expiry})
	if err != nil {
		return "", fmt.Errorf("blobstore: presigning a GET of %s: %w", key, err)
	}
	return u, nil
}
