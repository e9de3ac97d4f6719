package workerapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// Shares of what every caller of a Server shares (PROTOCOL.md §3,
// "Shares"), so that no one caller, with a valid credential, takes all of
// it: the memory that request bodies are read into, and the long-polls
// that hold a connection (and a goroutine) while they wait.

// The defaults of Shares.
const (
	// DefaultBodyBytes is the default of Shares.BodyBytes: 32 bodies at
	// DefaultBodyLimit, and thousands of a worker's usual few kilobytes.
	DefaultBodyBytes = 32 << 20
	// DefaultLongPollsPerNode is the default of Shares.LongPollsPerNode:
	// a worker needs two (a lease long-poll and a signals long-poll).
	DefaultLongPollsPerNode = 4
	// DefaultLongPolls is the default of Shares.LongPolls: three quarters
	// of cmd/server's default -max-conns (512), so that connections stay
	// for probes and for the requests that do not wait.
	DefaultLongPolls = 384
	// BodyWait is how long a request waits for its share of
	// Shares.BodyBytes before it is refused.
	BodyWait = time.Second
)

// Shares bound what the callers of a Server share. A zero field means its
// default.
type Shares struct {
	// BodyBytes is the budget of request-body bytes held in memory at
	// once, by all requests together. A request reserves its
	// Content-Length (or, for a chunked body, Config.BodyLimit) before it
	// reads a byte of its body, after its credential was checked; if the
	// budget does not hold it within BodyWait it is refused 503
	// server_busy, its body unread. The reservation is given back once
	// the request no longer needs its body: before a long-poll waits, or
	// when the request ends. Artifact parts stream and reserve nothing
	// (Artifacts.MaxUploadsPerWorker bounds them). Must be at least
	// Config.BodyLimit. Defaults to DefaultBodyBytes.
	BodyBytes int64
	// LongPollsPerNode caps the long-polls (lease and signals requests
	// with a wait_seconds above 0) one node has open at once on this
	// Server: one more is refused 429 too_many_long_polls before it does
	// anything. Defaults to DefaultLongPollsPerNode.
	LongPollsPerNode int
	// LongPolls caps the long-polls of all nodes open at once on this
	// Server: one more is refused 503 server_busy. A host that caps its
	// connections keeps it well under that cap, so that health probes
	// and requests that do not wait find a connection. Defaults to
	// DefaultLongPolls; a negative value means no limit.
	LongPolls int
}

// WithDefaults returns sh with its defaults filled in, or an error
// wrapping ErrConfig that names the first invalid setting. bodyLimit is
// Config.BodyLimit, with its default.
func (sh Shares) WithDefaults(bodyLimit int64) (Shares, error) {
	switch {
	case sh.BodyBytes < 0:
		return sh, fmt.Errorf("%w: Shares.BodyBytes is negative (%d)", ErrConfig, sh.BodyBytes)
	case sh.LongPollsPerNode < 0:
		return sh, fmt.Errorf("%w: Shares.LongPollsPerNode is negative (%d)", ErrConfig, sh.LongPollsPerNode)
	}
	if sh.BodyBytes == 0 {
		sh.BodyBytes = max(DefaultBodyBytes, bodyLimit)
	}
	if sh.BodyBytes < bodyLimit {
		return sh, fmt.Errorf("%w: Shares.BodyBytes %d is under BodyLimit %d: a body at the limit could never be read", ErrConfig, sh.BodyBytes, bodyLimit)
	}
	if sh.LongPollsPerNode == 0 {
		sh.LongPollsPerNode = DefaultLongPollsPerNode
	}
	if sh.LongPolls == 0 {
		sh.LongPolls = DefaultLongPolls
	}
	return sh, nil
}

// ErrServerBusy means a budget every caller shares is spent
// (Config.Shares): the request was refused before it did anything.
var ErrServerBusy = errors.New("the server is busy")

// ErrTooManyLongPolls means the node has Config.Shares.LongPollsPerNode
// long-polls open already.
var ErrTooManyLongPolls = errors.New("too many long-polls at once")

// shares holds a Server's Shares in use.
type shares struct {
	cfg    Shares
	bodies *semaphore.Weighted
	held   atomic.Int64 // bytes of bodies reserved
	mu     sync.Mutex
	polls  map[string]int // open long-polls by node
	total  int
}

func newShares(cfg Shares) *shares {
	return &shares{cfg: cfg, bodies: semaphore.NewWeighted(cfg.BodyBytes), polls: map[string]int{}}
}

// reserveBody reserves n bytes of the body budget, waiting at most
// BodyWait for them, and returns the function that gives back the bytes
// not yet given back: release(k) keeps k of them reserved (the body read
// is smaller than reserved), release(0) gives back all.
func (sh *shares) reserveBody(ctx context.Context, n int64) (release func(keep int64), err error) {
	if n <= 0 {
		return func(int64) {}, nil
	}
	wctx, cancel := context.WithTimeout(ctx, BodyWait)
	defer cancel()
	if err := sh.bodies.Acquire(wctx, n); err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("%w: the %d bytes that request bodies may hold at once are in use; retry", ErrServerBusy, sh.cfg.BodyBytes)
	}
	sh.held.Add(n)
	var mu sync.Mutex
	held := n
	return func(keep int64) {
		mu.Lock()
		defer mu.Unlock()
		if keep = min(max(keep, 0), held); keep < held {
			sh.held.Add(keep - held)
			sh.bodies.Release(held - keep)
			held = keep
		}
	}, nil
}

// openLongPoll opens one of node's long-polls, or refuses it, and returns
// the function that closes it (once; later calls do nothing).
func (sh *shares) openLongPoll(node string) (func(), error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if n := sh.polls[node]; n >= sh.cfg.LongPollsPerNode {
		return nil, fmt.Errorf("%w: the node has %d open, the limit; retry once one ends", ErrTooManyLongPolls, n)
	}
	if sh.cfg.LongPolls > 0 && sh.total >= sh.cfg.LongPolls {
		return nil, fmt.Errorf("%w: the server holds the %d long-polls it serves at once; retry", ErrServerBusy, sh.total)
	}
	sh.polls[node]++
	sh.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			if sh.polls[node]--; sh.polls[node] <= 0 {
				delete(sh.polls, node)
			}
			sh.total--
		})
	}, nil
}

// longPoll opens a long-poll of c's node for the rest of the request, or
// refuses it. A handler that runs again (its transaction retried) opens
// none more.
func (s *Server) longPoll(c *call) error {
	if c.polling {
		return nil
	}
	end, err := s.shares.openLongPoll(c.principal.ID)
	if err != nil {
		return err
	}
	c.polling = true
	c.cleanup(end)
	return nil
}

// BodyBytes reports the bytes of request bodies reserved now, of
// Config.Shares.BodyBytes.
func (s *Server) BodyBytes() int64 { return s.shares.held.Load() }
