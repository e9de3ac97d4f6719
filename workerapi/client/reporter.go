package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// Limits of what a Reporter sends in one log line: within the server's
// (wire.MaxMessageBytes, wire.MaxPayloadBytes), with room for the
// truncation mark and for a rune the cut splits.
const (
	maxLogMessage = wire.MaxMessageBytes - 32
	maxLogPayload = wire.MaxPayloadBytes
	maxLogBatch   = 256 << 10
)

// Reporter reports a running job's progress, logs, artifacts and
// result. Its methods are safe for concurrent use.
type Reporter struct {
	t    *task
	kick chan struct{}

	mu           sync.Mutex
	seqBase      int64
	n            int64
	pending      []wire.LogEntry
	pendingBytes int
	dropped      int64
	output       *string
	metrics      json.RawMessage
	final        *string

	sendMu sync.Mutex
}

// JobID returns the job's id.
func (r *Reporter) JobID() string { return r.t.id }

// Status reports a status event (POST /workers/jobs/{id}/status), which
// also extends the lease. payload must marshal to a JSON object (anything
// else is wrapped as {"value": payload}). If the answer says the job's
// cancel was requested, the job's context is cancelled with
// ErrJobCanceled.
func (r *Reporter) Status(ctx context.Context, eventType, message string, payload any) error {
	out, err := r.t.w.c.Status(ctx, r.t.id, wire.StatusRequest{LeaseToken: r.t.token, EventType: eventType,
		Message: message, Payload: objectPayload(payload)})
	if err != nil {
		if IsLeaseLost(err) {
			r.t.lose()
		}
		return err
	}
	r.t.extend(out.ExpiresAt)
	if out.CancelRequested {
		r.t.stop(ErrJobCanceled)
	}
	return nil
}

// Progress is Status with event_type "progress".
func (r *Reporter) Progress(ctx context.Context, message string, payload any) error {
	return r.Status(ctx, "progress", message, payload)
}

// Log buffers a log line; it never blocks on the network. Lines are sent
// in batches every LogFlushInterval, on Flush, and before the job's result,
// and sent again until the server acknowledges them: each line has a seq
// the server stores once, so a line sent twice is stored once. Seqs
// increase within the job and, starting from the time of accept in
// microseconds, across its attempts, since the server keeps each seq once
// per job. payload is as for Status.
func (r *Reporter) Log(message string, payload any) {
	if len(message) > maxLogMessage {
		message = message[:maxLogMessage] + "...(truncated)"
	}
	// The server refuses NUL in text (PROTOCOL.md §5.14 "Characters"),
	// and one NUL a job printed must not cost its batch.
	message = strings.ReplaceAll(message, "\x00", "\uFFFD")
	p := objectPayload(payload)
	if len(p) > maxLogPayload {
		p = json.RawMessage(`{"truncated":true}`)
	}
	r.mu.Lock()
	r.n++
	e := wire.LogEntry{Seq: r.seqBase + r.n, Message: message, Payload: p}
	r.pending = append(r.pending, e)
	r.pendingBytes += entrySize(e)
	for len(r.pending) > r.t.w.cfg.MaxBufferedLogs {
		r.pendingBytes -= entrySize(r.pending[0])
		r.pending = r.pending[1:]
		r.dropped++
	}
	full := len(r.pending) >= r.t.w.cfg.LogBatchSize || r.pendingBytes >= maxLogBatch
	r.mu.Unlock()
	if full {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// Logf is Log with a formatted message and no payload.
func (r *Reporter) Logf(format string, args ...any) { r.Log(fmt.Sprintf(format, args...), nil) }

func entrySize(e wire.LogEntry) int { return len(e.Message) + len(e.Payload) + 48 }

// Flush sends the buffered log lines now. Lines that could not be sent
// stay buffered.
func (r *Reporter) Flush(ctx context.Context) error {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	for {
		r.mu.Lock()
		if r.dropped > 0 {
			r.n++
			e := wire.LogEntry{Seq: r.seqBase + r.n, Message: fmt.Sprintf("%d log lines dropped: the buffer was full while the server was out of reach", r.dropped)}
			r.pending = append(r.pending, e)
			r.pendingBytes += entrySize(e)
			r.dropped = 0
		}
		n, size := 0, 0
		for n < len(r.pending) && n < r.t.w.cfg.LogBatchSize && (n == 0 || size+entrySize(r.pending[n]) <= maxLogBatch) {
			size += entrySize(r.pending[n])
			n++
		}
		batch := slices.Clone(r.pending[:n])
		r.mu.Unlock()
		if n == 0 {
			return nil
		}
		out, err := r.t.w.c.Logs(ctx, r.t.id, wire.LogsRequest{LeaseToken: r.t.token, Entries: batch})
		switch {
		case err == nil:
			r.t.extend(out.ExpiresAt)
		case IsLeaseLost(err):
			r.t.lose()
			return err
		case IsCode(err, wire.CodeInvalidRequest) || IsCode(err, wire.CodePayloadTooLarge):
			// Sending them again cannot help.
			r.t.w.log.Error("log lines refused: dropped", "job", r.t.id, "lines", n, "err", err)
		default:
			return err
		}
		last := batch[n-1].Seq
		r.mu.Lock()
		i := 0
		for i < len(r.pending) && r.pending[i].Seq <= last {
			r.pendingBytes -= entrySize(r.pending[i])
			i++
		}
		r.pending = r.pending[i:]
		r.mu.Unlock()
	}
}

// loop flushes the log buffer periodically until stop is closed.
func (r *Reporter) loop(stop <-chan struct{}) {
	tick := time.NewTicker(r.t.w.cfg.LogFlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		case <-r.kick:
		}
		ctx, cancel := context.WithTimeout(r.t.w.hardCtx, r.t.w.c.cfg.RequestTimeout)
		if err := r.Flush(ctx); err != nil && !IsLeaseLost(err) {
			r.t.w.log.Debug("log flush failed; the lines stay buffered", "job", r.t.id, "err", err)
		}
		cancel()
	}
}

// SetOutput sets what the completion reports if the handler returns nil:
// the output URI (empty for none), metrics (nil for none; otherwise a
// value that marshals to a JSON object) and a final message (empty for
// none).
func (r *Reporter) SetOutput(outputURI string, metrics any, finalMessage string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.output, r.final = nil, nil
	if outputURI != "" {
		r.output = &outputURI
	}
	if finalMessage != "" {
		r.final = &finalMessage
	}
	r.metrics = objectPayload(metrics)
}

func (r *Reporter) completeRequest() wire.CompleteRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return wire.CompleteRequest{LeaseToken: r.t.token, OutputURI: r.output, Metrics: r.metrics, FinalMessage: r.final}
}

// ArtifactInfo describes an artifact to report. Give Path to have the
// SHA-256 and size computed from a local file, or SHA256 and SizeBytes.
type ArtifactInfo struct {
	// Type and Name are artifact_type and name; URI is where it is stored.
	Type, Name, URI string
	// Path is a local copy of the artifact to checksum.
	Path string
	// SHA256 (64 lowercase hex digits) and SizeBytes, when Path is empty.
	SHA256    string
	SizeBytes int64
	// Metadata must marshal to a JSON object, or be nil.
	Metadata any
}

// Artifact reports an artifact (POST /workers/jobs/{id}/artifacts),
// computing its SHA-256 and size from Path if set.
func (r *Reporter) Artifact(ctx context.Context, a ArtifactInfo) (*wire.ArtifactResponse, error) {
	sum, size := a.SHA256, a.SizeBytes
	if a.Path != "" {
		var err error
		if sum, size, err = fileDigest(a.Path); err != nil {
			return nil, err
		}
	}
	req := wire.ArtifactRequest{LeaseToken: r.t.token, ArtifactType: a.Type, Name: a.Name, URI: a.URI,
		ChecksumSHA256: &sum, SizeBytes: &size, Metadata: objectPayload(a.Metadata)}
	out, err := r.t.w.c.Artifact(ctx, r.t.id, req)
	if IsLeaseLost(err) {
		r.t.lose()
	}
	return out, err
}

// fileDigest returns the SHA-256 (lowercase hex) and size of a file.
func fileDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("client: artifact: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("client: artifact: reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// isObject reports whether b is a JSON object.
func isObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c == '{'
	}
	return false
}

// objectPayload marshals v for a payload field, which must be a JSON
// object: nil gives null, a non-object is wrapped as {"value": v}.
func objectPayload(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": "payload not encodable: " + err.Error()})
		return b
	}
	if string(b) == "null" || isObject(b) {
		return b
	}
	b, _ = json.Marshal(map[string]json.RawMessage{"value": b})
	return b
}
