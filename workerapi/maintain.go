package workerapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nodelane/nodelane/receipts"
)

// MaintainOnce does one round of the maintainer's work (see Start) except
// sequencing, which the maintainer runs continuously (see Sequence). It is
// safe to call on every replica at once. While the clock-bound work is
// held (see CheckClock) it does nothing and returns an error wrapping
// ErrNotReady.
func (s *Server) MaintainOnce(ctx context.Context) error {
	if s.clockHeld() {
		return fmt.Errorf("%w: the maintainer is held until the clock agrees with the database's", ErrNotReady)
	}
	var errs []error
	n, err := s.leases.Expire(ctx)
	errs = append(errs, err)
	off, err := s.leases.ExpireOffline(ctx)
	errs = append(errs, err)
	if off > 0 {
		s.log.Info("ended the leases of offline workers", "leases", off)
	}
	if n+off > 0 {
		// Requeued jobs may be leasable now.
		errs = append(errs, s.st.Notifier.Notify(ctx))
	}
	errs = append(errs, s.expireActivation(ctx))
	_, err = s.verifier.Collect(ctx)
	errs = append(errs, err)
	// Without Config.Lease.Retention, Prune deletes nothing and reads nothing.
	_, err = s.leases.Prune(ctx)
	errs = append(errs, err)
	_, err = s.leases.ForgetAnswers(ctx)
	errs = append(errs, err)
	errs = append(errs, s.sweepArtifacts(ctx))
	return errors.Join(errs...)
}

// Sequence integrates every minted receipt into the log and signs a
// checkpoint for it; the maintainer does this continuously, and routes that
// answer with proofs wait for it.
func (s *Server) Sequence(ctx context.Context) (*receipts.Checkpoint, error) {
	for {
		n, err := s.seq.Sequence(ctx)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
	}
	return s.seq.Publish(ctx)
}

// proofPoll is how often awaitProofs, sequencing itself without Start,
// looks at the store for a checkpoint that another request or replica
// signed.
const proofPoll = 50 * time.Millisecond

// awaitProofs returns the receipts ids with their proofs against one
// signed checkpoint, waiting up to Config.ProofWait for them to be
// sequenced. The request path never sequences while the background
// sequencer runs (Start): it waits in the sequencer (Sequencer.Await),
// which it wakes, so that one batch, one transaction and one checkpoint
// serve every request waiting meanwhile, and the sequencer hands each the
// proofs of its receipts in memory, or tells it to read them from the
// store when another replica's sequencer took them. Without Start it
// sequences itself, and then reads the proofs from the store, again
// whenever this Server publishes a checkpoint and every proofPoll. After
// ProofWait it returns an error matching receipts.ErrNotSequenced.
func (s *Server) awaitProofs(ctx context.Context, ids []string) ([]*receipts.Stored, []receipts.Proof, *receipts.Checkpoint, error) {
	if s.life.running() {
		ctx, cancel := context.WithTimeout(ctx, s.cfg.ProofWait)
		defer cancel()
		return s.seq.Await(ctx, ids...)
	}
	if _, err := s.Sequence(ctx); err != nil {
		s.log.Debug("sequencing receipts for a proof", "err", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ProofWait)
	defer cancel()
	for {
		published := s.seq.Published()
		ss, ps, cp, err := s.receipts.ProveAll(ctx, ids...)
		if !errors.Is(err, receipts.ErrNotSequenced) || ctx.Err() != nil {
			if err != nil && ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", receipts.ErrNotSequenced, context.Cause(ctx))
			}
			return ss, ps, cp, err
		}
		t := time.NewTimer(proofPoll)
		select {
		case <-published:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// expireActivation records a passed activation deadline and mints its
// receipt, in one transaction.
func (s *Server) expireActivation(ctx context.Context) error {
	var minted *receipts.Stored
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		st, changed, err := s.gate.ExpireActivation(ctx)
		if err != nil || !changed {
			return err
		}
		minted, err = s.receipts.Mint(ctx, receipts.Receipt{
			Kind:          receipts.KindEnvelopeDeactivated,
			PolicyVersion: st.Version,
			Actor:         "system",
			Reason:        "activation deadline passed",
		})
		return err
	})
	if err == nil && minted != nil {
		r := *minted
		s.hooks.emit([]hookEvent{func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, r) }})
	}
	return err
}

// LocalNotifier is a Notifier and a SignalNotifier for one process: Notify
// wakes every subscriber of this LocalNotifier at once, NotifyWorker every
// subscriber of that worker's signals. It does not know transactions, so
// it keeps Notifier's commit rule only with stores whose writes are
// visible as soon as they are made (MemoryStores); with a transactional
// store it may wake a long-poll before the commit, which then finds
// nothing and waits for its next look, and workerapitest refuses it
// there. Use bunstore's Notifier, or pollnotify, with a database.
type LocalNotifier struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
	// workers are the subscribers of each worker's signals
	// (SignalNotifier).
	workers workerSubs
}

// NewLocalNotifier returns a LocalNotifier.
func NewLocalNotifier() *LocalNotifier {
	return &LocalNotifier{subs: map[chan struct{}]struct{}{}}
}

// Notify implements Notifier. It does not wait for a transaction the
// context carries: see LocalNotifier.
func (n *LocalNotifier) Notify(context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.subs {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	return nil
}

// Subscribe implements Notifier.
func (n *LocalNotifier) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	n.subs[ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		delete(n.subs, ch)
		n.mu.Unlock()
	}
}
