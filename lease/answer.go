package lease

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"
)

// AnswerKeyLen is the length of Answer.Key: a SHA-256.
const AnswerKeyLen = 32

// Answer is the first answer to a request that its sender may repeat
// under a key of its own, kept so that the repeat gets the same answer
// (workerapi keeps the answers of the worker routes that change state this
// way: see PROTOCOL.md "Retries"). A Store keeps it as given and decides
// nothing about it.
type Answer struct {
	// Key names the request: AnswerKeyLen bytes the caller derives from
	// who asked, what, and the sender's key.
	Key []byte
	// WorkerID is the worker the answer was given to.
	WorkerID string
	// Digest tells a repeat of the request from another request sent
	// under the same key.
	Digest []byte
	// Status is the answer's status; Body the answer, sealed by the
	// caller (it may hold secrets, such as a lease token).
	Status int
	Body   []byte
	// CreatedAt is when it was given; it is forgotten at ExpiresAt.
	CreatedAt time.Time
	ExpiresAt time.Time
}

func cloneAnswer(a *Answer) *Answer {
	c := *a
	c.Key, c.Digest, c.Body = slices.Clone(a.Key), slices.Clone(a.Digest), slices.Clone(a.Body)
	return &c
}

// answerBatch bounds the answers one DeleteAnswers call of
// Manager.ForgetAnswers deletes.
const answerBatch = 1000

// Remember stores the first answer to a request, in the transaction of
// ctx, with the Manager's clock as its CreatedAt. It returns ErrConflict
// if an answer under a.Key is remembered already (a concurrent request
// under the same key gave it), and ErrInvalidArgument for a key that is
// not AnswerKeyLen bytes or an ExpiresAt not after now.
func (m *Manager) Remember(ctx context.Context, a Answer) error {
	now := m.now()
	a.CreatedAt, a.ExpiresAt = now, a.ExpiresAt.UTC().Truncate(time.Microsecond)
	switch {
	case len(a.Key) != AnswerKeyLen:
		return fmt.Errorf("%w: an answer's key must be %d bytes", ErrInvalidArgument, AnswerKeyLen)
	case !a.ExpiresAt.After(now):
		return fmt.Errorf("%w: an answer must expire after it is given", ErrInvalidArgument)
	}
	return m.store.PutAnswer(ctx, &a)
}

// Recall returns the answer remembered under key, unless it expired.
// ErrNotFound.
func (m *Manager) Recall(ctx context.Context, key []byte) (*Answer, error) {
	return m.store.GetAnswer(ctx, key, m.now())
}

// ForgetAnswers deletes the answers that expired, in batches, and returns
// how many it deleted.
func (m *Manager) ForgetAnswers(ctx context.Context) (int, error) {
	now, total := m.now(), 0
	for {
		n, err := m.store.DeleteAnswers(ctx, now, answerBatch)
		total += n
		if err != nil || n < answerBatch {
			return total, err
		}
	}
}

// PutAnswer implements Store.
func (s *MemoryStore) PutAnswer(ctx context.Context, a *Answer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if old, ok := s.answers[string(a.Key)]; ok && old.ExpiresAt.After(a.CreatedAt) {
		return ErrConflict
	}
	s.answers[string(a.Key)] = cloneAnswer(a)
	return nil
}

// GetAnswer implements Store.
func (s *MemoryStore) GetAnswer(_ context.Context, key []byte, now time.Time) (*Answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.answers[string(key)]
	if !ok || !a.ExpiresAt.After(now) || !bytes.Equal(a.Key, key) {
		return nil, ErrNotFound
	}
	return cloneAnswer(a), nil
}

// DeleteAnswers implements Store.
func (s *MemoryStore) DeleteAnswers(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errLimit(limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	for k, a := range s.answers {
		if n == limit {
			break
		}
		if !a.ExpiresAt.After(now) {
			delete(s.answers, k)
			n++
		}
	}
	return n, nil
}
