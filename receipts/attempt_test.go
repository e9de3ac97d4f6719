package receipts_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/receipts"
)

// attemptFailed is a job_failed receipt of a lease that expired after
// its worker accepted it, with the attempt's GPU time.
func attemptFailed() receipts.Receipt {
	return receipts.Receipt{
		ID: "rcp_expired", Kind: receipts.KindJobFailed, PolicyVersion: 3, ServerTime: t0.Add(11 * time.Minute),
		JobID: "job_3", WorkerID: "wrk_1", LeaseID: "lse_3", JobType: "lora_train", LeaseEpoch: 2, Attempt: 1,
		ErrorCode: "lease_expired", Outcome: receipts.OutcomeRequeued,
		StartedAt: t0, EndedAt: t0.Add(10*time.Minute + 1500*time.Microsecond),
		ActualMS: 600_002, GPUCount: 2, Charged: receipts.ChargedNo,
	}
}

// TestAttemptFields checks that the optional actual_ms, gpu_count and charged of
// job_failed and job_completed round-trip, and receipts without them (the
// golden files, minted before they existed) still decode.
func TestAttemptFields(t *testing.T) {
	t.Parallel()
	r := attemptFailed()
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"actual_ms":600002,"attempt":1,"charged":"no","ended_at":"2026-11-30T09:10:00.001500Z","error_code":"lease_expired","gpu_count":2,"id":"rcp_expired","job_id":"job_3","job_type":"lora_train","kind":"job_failed","lease_epoch":2,"lease_id":"lse_3","outcome":"requeued","policy_version":3,"server_time":"2026-11-30T09:11:00.000000Z","started_at":"2026-11-30T09:00:00.000000Z","v":1,"worker_id":"wrk_1"}`
	if string(b) != want {
		t.Fatalf("Encode =\n%s\nwant\n%s", b, want)
	}
	got, err := receipts.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.ActualMS != r.ActualMS || got.GPUCount != 2 || got.Charged != receipts.ChargedNo {
		t.Fatalf("Decode = %+v", got)
	}

	// Never accepted: no started_at, no actual_ms; charged still says no.
	never := attemptFailed()
	never.StartedAt, never.ActualMS, never.ErrorCode = time.Time{}, 0, "accept_timeout"
	b, err = never.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "actual_ms") || !strings.Contains(string(b), `"charged":"no"`) {
		t.Fatalf("never accepted: %s", b)
	}
	if _, err := receipts.Decode(b); err != nil {
		t.Fatal(err)
	}

	done := golden()[receipts.KindJobCompleted]
	done.ActualMS, done.GPUCount, done.Charged = 1234, 1, receipts.ChargedYes
	if b, err = done.Encode(); err != nil {
		t.Fatal(err)
	}
	if _, err := receipts.Decode(b); err != nil {
		t.Fatal(err)
	}
	for _, k := range []receipts.Kind{receipts.KindJobFailed, receipts.KindJobCompleted} {
		old := golden()[k]
		b, err := old.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "charged") {
			t.Fatalf("an old %s receipt grew a field: %s", k, b)
		}
		if _, err := receipts.Decode(b); err != nil {
			t.Fatalf("an old %s receipt no longer decodes: %v", k, err)
		}
	}
}

func TestAttemptFieldsRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*receipts.Receipt)
		want   error
	}{
		{"actual_ms off by one", func(r *receipts.Receipt) { r.ActualMS++ }, receipts.ErrInconsistent},
		{"actual_ms without started_at", func(r *receipts.Receipt) { r.StartedAt = time.Time{} }, receipts.ErrInconsistent},
		{"charged maybe", func(r *receipts.Receipt) { r.Charged = "maybe" }, receipts.ErrInconsistent},
		{"negative gpu_count", func(r *receipts.Receipt) { r.GPUCount = -1 }, receipts.ErrInvalidArgument},
		{"charged on a charge", func(r *receipts.Receipt) { r.Kind = receipts.KindNodeAudit }, receipts.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := attemptFailed()
			tc.mutate(&r)
			if _, err := r.Encode(); !errors.Is(err, tc.want) {
				t.Fatalf("Encode = %v, want %v", err, tc.want)
			}
		})
	}
	af := attemptFailed()
	good, err := af.Encode()
	if err != nil {
		t.Fatal(err)
	}
	edits := []struct {
		name, old, new string
		want           error
	}{
		{"charged as a boolean", `"charged":"no"`, `"charged":false`, receipts.ErrNotCanonical},
		{"charged as an integer", `"charged":"no"`, `"charged":0`, receipts.ErrNotCanonical},
		{"charged empty", `"charged":"no"`, `"charged":""`, receipts.ErrNotCanonical},
		{"charged unknown", `"charged":"no"`, `"charged":"nope"`, receipts.ErrInconsistent},
		{"actual_ms 0", `"actual_ms":600002`, `"actual_ms":0`, receipts.ErrNotCanonical},
		{"actual_ms as a string", `"actual_ms":600002`, `"actual_ms":"600002"`, receipts.ErrNotCanonical},
		{"gpu_count 0", `"gpu_count":2`, `"gpu_count":0`, receipts.ErrNotCanonical},
	}
	for _, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			body := strings.Replace(string(good), e.old, e.new, 1)
			if body == string(good) {
				t.Fatalf("the edit %q changed nothing", e.old)
			}
			if _, err := receipts.Decode([]byte(body)); !errors.Is(err, e.want) {
				t.Fatalf("Decode(%s) = %v, want %v", body, err, e.want)
			}
		})
	}
}
