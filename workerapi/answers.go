package workerapi

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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
//
// The answer is sealed (AES-256-GCM), since a lease's answer holds lease
// tokens, which the database must not: under a key derived (HKDF) from
// the same and, as salt, a pepper (Config.Peppers), so that opening it
// takes both the worker's key and the server's secret, and a weak key (a
// third-party client's counter) read with the database opens nothing.
// The sealed answer is
//
//	"nla2" || pepper version (4 bytes, big-endian) || nonce || ciphertext
//
// with the first 8 bytes and the answer's id as additional data. Answers
// sealed before the pepper took part (v1: nonce || ciphertext, under a
// key derived from the worker's key alone) still open, until they expire
// (Config.AnswerTTL); a v1 answer whose random nonce happens to begin
// with "nla2" is opened as v1 when it does not open as v2.

// DefaultAnswerTTL is the default of Config.AnswerTTL.
const DefaultAnswerTTL = 24 * time.Hour

// keyed is a request that names its first answer.
type keyed struct {
	id     []byte // lease.Answer.Key
	secret []byte // the worker's key, which the sealing keys derive from
	scope  string // the route, worker and job the key is scoped to
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
	c.keyed = &keyed{id: id, secret: []byte(key), scope: scope, digest: digest[:]}
	return c.keyed, nil
}

// sealMagic begins an answer sealed under a pepper (v2).
const sealMagic = "nla2"

// sealHeaderLen is the length of a v2 answer's header: sealMagic and the
// pepper version.
const sealHeaderLen = len(sealMagic) + 4

// aead is the AES-256-GCM of k's answer: with pepper nil, as sealed
// before the pepper took part (v1); else under pepper (v2).
func (k *keyed) aead(pepper []byte) (cipher.AEAD, error) {
	info := k.scope + "\x00seal"
	if pepper != nil {
		info += " v2"
	}
	key, err := hkdf.Key(sha256.New, k.secret, pepper, info, 32)
	if err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// seal seals body under the pepper of version v (v2), with a nonce read
// from rand.
func (k *keyed) seal(rand io.Reader, v int, pepper, body []byte) ([]byte, error) {
	aead, err := k.aead(pepper)
	if err != nil {
		return nil, err
	}
	out := make([]byte, sealHeaderLen+aead.NonceSize(), sealHeaderLen+aead.NonceSize()+len(body)+aead.Overhead())
	copy(out, sealMagic)
	binary.BigEndian.PutUint32(out[len(sealMagic):], uint32(v))
	if _, err := io.ReadFull(rand, out[sealHeaderLen:]); err != nil {
		return nil, fmt.Errorf("workerapi: reading randomness: %w", err)
	}
	header, nonce := out[:sealHeaderLen], out[sealHeaderLen:]
	return aead.Seal(out, nonce, body, append(slices.Clip(k.id), header...)), nil
}

// open opens an answer sealed by seal under one of peppers, or sealed
// before the pepper took part (v1).
func (k *keyed) open(peppers map[int][]byte, sealed []byte) ([]byte, error) {
	if len(sealed) > sealHeaderLen && string(sealed[:len(sealMagic)]) == sealMagic {
		v := int(binary.BigEndian.Uint32(sealed[len(sealMagic):sealHeaderLen]))
		if pepper := peppers[v]; pepper != nil {
			body, err := k.openWith(pepper, sealed[sealHeaderLen:], append(slices.Clip(k.id), sealed[:sealHeaderLen]...))
			if err == nil {
				return body, nil
			}
		}
		// Not v2 under a pepper configured: maybe v1 (below).
	}
	return k.openWith(nil, sealed, k.id)
}

// openWith opens nonce || ciphertext under k's key for pepper.
func (k *keyed) openWith(pepper, sealed, ad []byte) ([]byte, error) {
	aead, err := k.aead(pepper)
	if err != nil {
		return nil, err
	}
	n := aead.NonceSize()
	if len(sealed) < n {
		return nil, fmt.Errorf("workerapi: a remembered answer is %d bytes, too short", len(sealed))
	}
	return aead.Open(nil, sealed[:n], sealed[n:], ad)
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
	body, err := k.open(s.cfg.Peppers, a.Body)
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
	v := s.cfg.PepperVersion
	sealed, err := k.seal(s.cfg.Rand, v, s.cfg.Peppers[v], bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	if err != nil {
		return err
	}
	return s.leases.Remember(ctx, lease.Answer{
		Key: k.id, WorkerID: c.principal.ID, Digest: k.digest, Status: code, Body: sealed, ExpiresAt: expires,
	})
}

// answerExpiry is when an answer given now is forgotten: after
// Config.AnswerTTL.
func (s *Server) answerExpiry() time.Time { return s.now().Add(s.cfg.AnswerTTL) }
