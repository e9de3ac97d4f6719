package leasetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

var eventTests = []test{
	{"LogSeqIdempotent", testLogSeq},
	{"Artifacts", testArtifacts},
	{"StoredArtifact", testStoredArtifact},
}

func testLogSeq(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(time.Minute)
	res, err := f.m.RecordEvents(f.ctx, ref,
		lease.Event{Kind: lease.EventLog, Seq: 1, Message: "epoch 1", Payload: json.RawMessage(`{"loss":1.5}`)},
		lease.Event{Kind: lease.EventLog, Seq: 2, Message: "epoch 2"},
		lease.Event{Kind: lease.EventLog, Seq: 2, Message: "epoch 2 again"},
		lease.Event{Kind: lease.EventStatus, Type: "progress", Message: "50%"},
		lease.Event{Kind: lease.EventStatus, Type: "progress", Message: "50%"},
	)
	if err != nil || res.Accepted != 4 || res.Duplicates != 1 {
		t.Fatalf("RecordEvents = %+v, %v", res, err)
	}
	if !res.Job.Lease.ExpiresAt.Equal(f.clock.Now().UTC().Truncate(time.Microsecond).Add(ttl)) {
		t.Fatal("events did not extend the lease")
	}
	res, err = f.m.RecordEvents(f.ctx, ref, lease.Event{Kind: lease.EventLog, Seq: 1, Message: "resent"}, lease.Event{Kind: lease.EventLog, Seq: 3, Message: "epoch 3"})
	if err != nil || res.Accepted != 1 || res.Duplicates != 1 {
		t.Fatalf("resend = %+v, %v", res, err)
	}
	evs, err := f.m.Events(f.ctx, j.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, e := range evs {
		got = append(got, fmt.Sprintf("%s:%d:%s", e.Kind, e.Seq, e.Message))
		if e.Epoch != 1 || e.JobID != j.ID || (i > 0 && e.ID <= evs[i-1].ID) {
			t.Errorf("event %d = %+v", i, e)
		}
	}
	want := []string{"log:1:epoch 1", "log:2:epoch 2", "status:0:50%", "status:0:50%", "log:3:epoch 3"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("stored events (-want +got):\n%s", d)
	}
	if string(evs[0].Payload) != `{"loss":1.5}` {
		t.Fatalf("payload = %s", evs[0].Payload)
	}
	page, err := f.m.Events(f.ctx, j.ID, evs[1].ID, 2)
	if err != nil || len(page) != 2 || page[0].ID != evs[2].ID {
		t.Fatalf("paging events after %d: %v, %v", evs[1].ID, page, err)
	}
	for _, bad := range []lease.Event{{Kind: lease.EventLog, Message: "no seq"}, {Kind: lease.EventStatus}, {Kind: "other", Type: "x"}, {Kind: lease.EventLog, Seq: 9, Payload: json.RawMessage(`{`)}} {
		_, err := f.m.RecordEvents(f.ctx, ref, bad)
		wantErr(t, fmt.Sprintf("event %+v", bad), err, lease.ErrInvalidArgument)
	}
	_, err = f.m.RecordEvents(f.ctx, ref)
	wantErr(t, "no events", err, lease.ErrInvalidArgument)
}

func testArtifacts(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j1 := f.enqueue("lora_train")
	j2 := f.enqueue("status_check")
	_, r1 := f.leaseOne(w)
	_, r2 := f.leaseOne(w)
	f.accept(r1)
	sum := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	a, err := f.m.AddArtifact(f.ctx, r1, lease.Artifact{Type: "adapter", Name: "adapter.safetensors", URI: "s3://b/a", SHA256: sum, SizeBytes: 123, Metadata: json.RawMessage(`{"rank":8}`), ReceiptID: "rcp_x"})
	if err != nil || a.ID == "" || a.JobID != j1.ID || a.WorkerID != w.ID || a.Epoch != 1 {
		t.Fatalf("AddArtifact = %+v, %v", a, err)
	}
	if _, err := f.m.AddArtifact(f.ctx, r2, lease.Artifact{Type: "log", Name: "out.txt"}); err != nil {
		t.Fatal(err)
	}
	all, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("all artifacts: %v, %v", all, err)
	}
	got, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: j1.ID})
	if err != nil || len(got) != 1 {
		t.Fatalf("by job: %v, %v", got, err)
	}
	if d := cmp.Diff(a, got[0]); d != "" {
		t.Fatalf("stored artifact (-added +stored):\n%s", d)
	}
	if got, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{Type: "log"}); err != nil || len(got) != 1 || got[0].JobID != j2.ID {
		t.Fatalf("by type: %v, %v", got, err)
	}
	if got, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{After: all[0].ID}); err != nil || len(got) != 1 || got[0].ID != all[1].ID {
		t.Fatalf("after: %v, %v", got, err)
	}
	bad := []lease.Artifact{
		{Name: "no type"},
		{Type: "adapter"},
		{Type: "adapter", Name: "x", SHA256: "ABC"},
		{Type: "adapter", Name: "x", SHA256: "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"},
		{Type: "adapter", Name: "x", SizeBytes: -1},
		{Type: "adapter", Name: "x", Metadata: json.RawMessage(`[`)},
	}
	for _, b := range bad {
		_, err := f.m.AddArtifact(f.ctx, r1, b)
		wantErr(t, fmt.Sprintf("artifact %+v", b), err, lease.ErrInvalidArgument)
	}
}

// testStoredArtifact: an artifact's Object and PartSize (where its bytes
// are stored) round-trip through AddArtifact, GetArtifact and
// ListArtifacts, a part size past 32 bits included; a metadata-only
// artifact reads back without them; an unknown id is ErrNotFound.
func testStoredArtifact(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("lora_train")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	sum := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	object := "jobs/" + j.ID + "/0123456789abcdef0123456789abcdef/"
	stored, err := f.m.AddArtifact(f.ctx, ref, lease.Artifact{
		Type: "checkpoint", Name: "step-100.ckpt", SHA256: sum, SizeBytes: 10 << 30, Object: object, PartSize: 5 << 30, ReceiptID: "rcp_s",
	})
	if err != nil {
		t.Fatalf("AddArtifact(stored) = %v", err)
	}
	meta, err := f.m.AddArtifact(f.ctx, ref, lease.Artifact{Type: "log", Name: "out.txt", URI: "s3://b/out.txt"})
	if err != nil {
		t.Fatalf("AddArtifact(metadata) = %v", err)
	}
	for _, want := range []*lease.Artifact{stored, meta} {
		got, err := f.store.GetArtifact(f.ctx, want.ID)
		if err != nil {
			t.Fatalf("GetArtifact(%s) = %v", want.ID, err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("GetArtifact(%s) (-added +stored):\n%s", want.ID, d)
		}
		if got, err := f.m.Artifact(f.ctx, want.ID); err != nil || got.Object != want.Object || got.PartSize != want.PartSize {
			t.Errorf("Manager.Artifact(%s) = %+v, %v", want.ID, got, err)
		}
	}
	list, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: j.ID})
	if err != nil || len(list) != 2 {
		t.Fatalf("Artifacts = %v, %v", list, err)
	}
	want := []*lease.Artifact{stored, meta}
	if meta.ID < stored.ID { // ids made in the same millisecond
		want = []*lease.Artifact{meta, stored}
	}
	if d := cmp.Diff(want, list); d != "" {
		t.Errorf("ListArtifacts (-added +listed):\n%s", d)
	}
	if meta.Object != "" || meta.PartSize != 0 {
		t.Errorf("a metadata-only artifact has Object %q, PartSize %d", meta.Object, meta.PartSize)
	}
	_, err = f.store.GetArtifact(f.ctx, "art_unknown")
	wantErr(t, "GetArtifact(unknown)", err, lease.ErrNotFound)
	_, err = f.m.Artifact(f.ctx, "art_unknown")
	wantErr(t, "Manager.Artifact(unknown)", err, lease.ErrNotFound)
}
