package workerapi_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// registry is a host's model registry: it takes in the adapter of every
// lora_train job that succeeds.
type registry struct {
	srv *workerapi.Server // set once workerapi.New returned
	dir string
}

// JobChanged copies the stored bytes of a succeeded lora_train job's
// adapter into the registry. The Server checked them against the
// worker's declared sha256 and size before it recorded the artifact.
func (r *registry) JobChanged(ctx context.Context, e workerapi.JobEvent) {
	if e.Job.State != lease.StateSucceeded || e.Job.Type != "lora_train" {
		return
	}
	for _, a := range e.Artifacts {
		if a.Type != "adapter" || a.Object == "" { // "" : metadata only
			continue
		}
		if err := r.take(ctx, a.ID); err != nil {
			slog.Error("registry: taking an adapter", "artifact_id", a.ID, "err", err)
		}
	}
}

// ReceiptMinted is not needed by the registry.
func (r *registry) ReceiptMinted(context.Context, receipts.Stored) {}

func (r *registry) take(ctx context.Context, id string) error {
	a, bytes, err := r.srv.OpenArtifact(ctx, id)
	if err != nil {
		return err
	}
	defer bytes.Close()
	f, err := os.CreateTemp(r.dir, "incoming-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	if _, err := io.Copy(f, bytes); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(r.dir, a.SHA256+".safetensors"))
}

// A host's hook lands a trained adapter in its registry: the hook sees
// the job succeed with its artifacts, and Server.OpenArtifact reads the
// bytes the worker uploaded, from whichever store Config.Artifacts.Store
// names (see the blobstore module).
func ExampleServer_OpenArtifact() {
	reg := &registry{dir: "/var/lib/registry/adapters"}
	cfg := workerapi.Config{Hooks: reg /* , Artifacts: workerapi.ArtifactConfig{Store: store}, … */}
	_ = cfg // srv, err := workerapi.New(stores, cfg); reg.srv = srv
}
