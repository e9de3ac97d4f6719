package operator_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func TestDownloadArtifact(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	n := f.node(t, "gpu-content")
	data := bytes.Repeat([]byte("nodelane "), 1000)
	s := sha256.Sum256(data)
	sum := hex.EncodeToString(s[:])
	id := f.stored(t, n, data, sum)

	var buf bytes.Buffer
	ct, err := f.api.DownloadArtifact(ctx, id, &buf)
	if err != nil || !bytes.Equal(buf.Bytes(), data) || ct.SHA256 != sum || ct.Size != int64(len(data)) || ct.Filename != "adapter.safetensors" {
		t.Fatalf("DownloadArtifact = %+v, %v; %d bytes", ct, err, buf.Len())
	}
	st, err := f.api.StatArtifactContent(ctx, id)
	if err != nil || *st != *ct {
		t.Errorf("StatArtifactContent = %+v, %v, want %+v", st, err, ct)
	}
	r, ct2, err := f.api.ArtifactContent(ctx, id, 4000)
	if err != nil {
		t.Fatal(err)
	}
	tail, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(tail, data[4000:]) || ct2.Size != int64(len(data)) {
		t.Errorf("ArtifactContent from 4000: %d bytes, %+v, %v", len(tail), ct2, err)
	}

	// Bytes that are not the artifact's: the download says so.
	bad := f.stored(t, n, data, "00"+sum[2:])
	if _, err := f.api.DownloadArtifact(ctx, bad, io.Discard); !errors.Is(err, operator.ErrContentMismatch) {
		t.Errorf("a mismatch: %v", err)
	}
	// A metadata-only artifact has no content.
	var we *wire.Error
	if _, err := f.api.DownloadArtifact(ctx, "art_unknown", io.Discard); !errors.As(err, &we) || we.Status != http.StatusNotFound || we.Code != wire.CodeNotFound {
		t.Errorf("unknown artifact: %v", err)
	}
	if _, err := f.api.StatArtifactContent(ctx, "art_unknown"); !errors.As(err, &we) || we.Status != http.StatusNotFound {
		t.Errorf("HEAD of an unknown artifact: %v", err)
	}
}
