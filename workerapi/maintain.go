package workerapi

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nodelane/nodelane/receipts"
)

// Maintain runs the background work of DESIGN §5 until ctx ends: it
// expires leases, records the end of timed activations (with their
// receipts), sequences receipts and signs checkpoints, and collects
// expired nonces, every interval (1 s if zero or negative). It is safe to
// run on every replica at once: each step is conditional on what it read,
// and the sequencer is one at a time across replicas. The same checks also
// run lazily where a request needs them. It returns ctx's error.
func (s *Server) Maintain(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = time.Second
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.seq.Run(ctx)
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.MaintainOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("maintainer", "err", err)
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// MaintainOnce does one round of Maintain's work except sequencing, which
// Maintain runs continuously (see Sequence).
func (s *Server) MaintainOnce(ctx context.Context) error {
	var errs []error
	n, err := s.leases.Expire(ctx)
	errs = append(errs, err)
	if n > 0 {
		// Requeued jobs may be leasable now.
		errs = append(errs, s.st.Notifier.Notify(ctx))
	}
	errs = append(errs, s.expireActivation(ctx))
	_, err = s.verifier.Collect(ctx)
	errs = append(errs, err)
	return errors.Join(errs...)
}

// Sequence integrates every minted receipt into the log and signs a
// checkpoint for it; Maintain does this continuously, and routes that
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
		s.hooks.emit([]func(Hooks){func(h Hooks) { h.ReceiptMinted(context.Background(), r) }})
	}
	return err
}

// LocalNotifier is a Notifier for one process: Notify wakes every
// subscriber of this LocalNotifier at once. Use it with stores that live
// in one process (MemoryStores, a SQLite file).
type LocalNotifier struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

// NewLocalNotifier returns a LocalNotifier.
func NewLocalNotifier() *LocalNotifier {
	return &LocalNotifier{subs: map[chan struct{}]struct{}{}}
}

// Notify implements Notifier. It does not wait for a transaction: a
// long-poll woken early finds nothing new and waits again.
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
