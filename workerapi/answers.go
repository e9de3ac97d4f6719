package workerapi

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Retries (PROTOCOL.md "Retries"). A worker route that changes state and
// is not idempotent by itself (lease, status, logs, artifacts, audit,
// fail, release, token) remembers its first answer under a key the worker
// sends (request_id, idempotency_key; for fail and release the lease
// token, for a token renewal the bearer token), in the request's
// transaction, and answers a repeat with it. The key is scoped:
// the answer is found under a SHA-256 derived (HKDF) from the route, the
// worker, the job of the path and the key, so one worker cannot reach
// another's answers, and one key names one request per route and job.
// The answer is sealed (AES-256-GCM) under a second key derived from the
// same, since a lease's answer holds lease tokens, which the database
// must not: only a caller that knows the key can open it.

// DefaultAnswerTTL is the default of Config.AnswerTTL.
const DefaultAnswerTTL = 24 * time.Hour

// keyed is a request that names its first answer.
type keyed struct {
	id     []byte // lease.Answer.Key
	seal   []byte // the AES-256 key of the answer's body
	digest []byte // the SHA-256 of the request's content
	// byToken marks a key that is a token (fail and release: the lease
	// token; token: the bearer token): another body under it is no
	// repeat, and runs as any request, which finds the lease ended (409
	// lease_lost).
	byToken bool
}

// checkKey checks a request_id or idempotency_key: absent, or
// wire.MinIdempotencyKeyBytes to wire.MaxIdempotencyKeyBytes of
// [A-Za-z0-9._~-].
func checkKey(field, key string) error {
	if key == "" {
		return nil
	}
	if len(key) < wire.MinIdempotencyKeyBytes || len(key) > wire.MaxIdempotencyKeyBytes {
		return invalid("%s must be %d to %d characters", field, wire.MinIdempotencyKeyBytes, wire.MaxIdempotencyKeyBytes)
	}
	if strings.Trim(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-") != "" {
		return invalid("%s may hold only A-Z, a-z, 0-9 and . _ ~ -", field)
	}
	return nil
}

// tokenKeyFor is keyFor for a request whose key is its lease token.
func tokenKeyFor(c *call, route string, ref lease.Ref, req any) (*keyed, error) {
	k, err := keyFor(c, route, ref.JobID, ref.Token, req)
	if err != nil {
		return nil, err
	}
	k.byToken = true
	return k, nil
}

// keyFor derives the keys of the answer to the request req, sent by c's
// worker to route (for the job jobID, or "") under key. An empty key
// names nothing: keyFor returns nil. It notes the request as keyed on c,
// so that if its transaction fails, signed looks for the answer of a
// concurrent request under the same key.
func keyFor(c *call, route, jobID, key string, req any) (*keyed, error) {
	if key == "" {
		return nil, nil
	}
	// The request's content as decoded, so that a repeat encoded another
	// way (spacing, field order) is still a repeat.
	content, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256(content)
	scope := strings.Join([]string{"nodelane answer v1", route, c.principal.ID, jobID}, "\x00")
	id, err := hkdf.Key(sha256.New, []byte(key), nil, scope+"\x00id", lease.AnswerKeyLen)
	if err != nil {
		return nil, err
	}
	seal, err := hkdf.Key(sha256.New, []byte(key), nil, scope+"\x00seal", 32)
	if err != nil {
		return nil, err
	}
	c.keyed = &keyed{id: id, seal: seal, digest: digest[:]}
	return c.keyed, nil
}

// recall returns the first answer to k's request, if one is remembered:
// ok is false if none is. A request under the same key with another body
// is ErrIdempotencyMismatch, unless the key is a lease token: then there
// is no answer to it.
func (s *Server) recall(ctx context.Context, k *keyed) (code int, out json.RawMessage, ok bool, err error) {
	if k == nil {
		return 0, nil, false, nil
	}
	a, err := s.leases.Recall(ctx, k.id)
	if errors.Is(err, lease.ErrNotFound) {
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, err
	}
	if subtle.ConstantTimeCompare(a.Digest, k.digest) != 1 {
		if k.byToken {
			return 0, nil, false, nil
		}
		return 0, nil, false, ErrIdempotencyMismatch
	}
	aead, err := answerAEAD(k.seal)
	if err != nil {
		return 0, nil, false, err
	}
	n := aead.NonceSize()
	if len(a.Body) < n {
		return 0, nil, false, fmt.Errorf("workerapi: a remembered answer is %d bytes, too short", len(a.Body))
	}
	body, err := aead.Open(nil, a.Body[:n], a.Body[n:], k.id)
	if err != nil {
		return 0, nil, false, fmt.Errorf("workerapi: opening a remembered answer: %w", err)
	}
	return a.Status, body, true, nil
}

// remember keeps code and out as the first answer to k's request until
// expires, in the transaction of ctx. A concurrent request under the same
// key that remembered first makes it fail (lease.ErrConflict), and its
// transaction with it: signed then answers with that request's answer.
func (s *Server) remember(ctx context.Context, c *call, k *keyed, code int, out any, expires time.Time) error {
	if k == nil {
		return nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return err
	}
	aead, err := answerAEAD(k.seal)
	if err != nil {
		return err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+buf.Len()+aead.Overhead())
	if _, err := io.ReadFull(s.cfg.Rand, nonce); err != nil {
		return fmt.Errorf("workerapi: reading randomness: %w", err)
	}
	return s.leases.Remember(ctx, lease.Answer{
		Key: k.id, WorkerID: c.principal.ID, Digest: k.digest, Status: code,
		Body: aead.Seal(nonce, nonce, bytes.TrimSuffix(buf.Bytes(), []byte("\n")), k.id), ExpiresAt: expires,
	})
}

func answerAEAD(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// answerExpiry is when an answer given now is forgotten: after
// Config.AnswerTTL.
func (s *Server) answerExpiry() time.Time { return s.now().Add(s.cfg.AnswerTTL) }
