package receipts

import (
	"fmt"
	"sync"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// WireReceipt is a receipt as the protocol carries it: body is the
// base64 of its canonical bytes, index is null until it is sequenced.
type WireReceipt struct {
	ID    string `json:"id"`
	Kind  Kind   `json:"kind"`
	Index *int64 `json:"index"`
	Body  []byte `json:"body"`
}

// Proof is an RFC 6962 inclusion proof as the protocol carries it: the
// receipt at Index is in the tree of TreeSize receipts, Hashes being the
// audit path (base64 on the wire).
type Proof struct {
	Index    int64       `json:"index"`
	TreeSize int64       `json:"tree_size"`
	Hashes   []tlog.Hash `json:"hashes"`
}

// maxProofHashes bounds a proof's length: a tree of at most 2^63 leaves
// has audit paths of at most 63 hashes.
const maxProofHashes = 63

// Verify checks, offline and with nothing but its arguments, that body
// is a receipt of the log whose checkpoints verifierKey signs under
// origin: the checkpoint's signature and form, that proof is for the
// checkpoint's tree size and an index inside it, that the inclusion
// proof holds for the leaf hash of body, and that body is canonical. It
// returns the decoded receipt, or the first check that failed:
// ErrUnknownKey, ErrBadSignature, ErrBadCheckpoint, ErrBadProof,
// ErrNotCanonical, ErrInconsistent.
func Verify(verifierKey, origin string, body []byte, proof Proof, signedCheckpoint []byte) (*Receipt, error) {
	cp, err := OpenCheckpoint(signedCheckpoint, verifierKey, origin)
	if err != nil {
		return nil, err
	}
	if err := CheckInclusion(cp, body, proof); err != nil {
		return nil, err
	}
	return Decode(body)
}

// CheckInclusion checks that proof shows body at proof.Index in the tree
// of an already verified checkpoint. ErrBadProof.
func CheckInclusion(cp *Checkpoint, body []byte, proof Proof) error {
	if proof.TreeSize != cp.Size {
		return fmt.Errorf("%w: the proof is for a tree of %d, the checkpoint's has %d", ErrBadProof, proof.TreeSize, cp.Size)
	}
	if proof.Index < 0 || proof.Index >= cp.Size {
		return fmt.Errorf("%w: index %d is outside the tree of %d", ErrBadProof, proof.Index, cp.Size)
	}
	if len(proof.Hashes) > maxProofHashes {
		return fmt.Errorf("%w: %d hashes", ErrBadProof, len(proof.Hashes))
	}
	if err := tlog.CheckRecord(proof.Hashes, cp.Size, cp.Root, proof.Index, tlog.RecordHash(body)); err != nil {
		return fmt.Errorf("%w: receipt %d is not in the tree of %d: %v", ErrBadProof, proof.Index, cp.Size, err)
	}
	return nil
}

// CheckConsistency checks that the tree newer extends the tree older,
// with the RFC 6962 consistency proof from Log.ConsistencyProof.
// ErrRollback if newer is smaller, ErrFork if both have one size and
// different roots, ErrBadProof if the proof does not hold.
func CheckConsistency(older, newer Tree, proof []tlog.Hash) error {
	switch {
	case newer.Size < older.Size:
		return fmt.Errorf("%w: tree of %d after one of %d", ErrRollback, newer.Size, older.Size)
	case newer.Size == older.Size:
		if newer.Root != older.Root {
			return fmt.Errorf("%w: two roots for the tree of %d", ErrFork, newer.Size)
		}
		if len(proof) != 0 {
			return fmt.Errorf("%w: a tree is consistent with itself without hashes", ErrBadProof)
		}
		return nil
	case older.Size == 0:
		// Every tree extends the empty one.
		if older.Root != EmptyTree().Root || len(proof) != 0 {
			return fmt.Errorf("%w: bad empty tree or proof", ErrBadProof)
		}
		return nil
	}
	if len(proof) > 2*maxProofHashes {
		return fmt.Errorf("%w: %d hashes", ErrBadProof, len(proof))
	}
	if err := tlog.CheckTree(proof, newer.Size, newer.Root, older.Size, older.Root); err != nil {
		return fmt.Errorf("%w: the tree of %d does not extend the tree of %d: %v", ErrBadProof, newer.Size, older.Size, err)
	}
	return nil
}

// Witness follows one log's checkpoints and raises the alarm when the log
// rewrites its history: it keeps the last checkpoint it verified and
// accepts a new one only if it is signed, no smaller (else ErrRollback),
// of the same root when of the same size (else ErrFork), and proven to
// extend the last one (else ErrBadProof). A rejected checkpoint leaves
// the Witness as it was. It is safe for concurrent use.
type Witness struct {
	verifier note.Verifier
	origin   string

	mu   sync.Mutex
	last *Checkpoint
}

// NewWitness returns a Witness of the log signed by verifierKey under
// origin. trusted, if not nil, is a checkpoint obtained out of band that
// later ones must extend; otherwise the first one Update sees is trusted.
func NewWitness(verifierKey, origin string, trusted *Checkpoint) (*Witness, error) {
	v, err := note.NewVerifier(verifierKey)
	if err != nil {
		return nil, fmt.Errorf("%w: verifier key: %v", ErrInvalidArgument, err)
	}
	if err := checkOrigin(origin); err != nil {
		return nil, err
	}
	w := &Witness{verifier: v, origin: origin}
	if trusted != nil {
		c := *trusted
		w.last = &c
	}
	return w, nil
}

// Update verifies signed and, given a consistency proof from the last
// checkpoint's size to its own (empty when the Witness has none yet or
// the size did not change), makes it the last checkpoint. It returns it.
func (w *Witness) Update(signed []byte, consistency []tlog.Hash) (*Checkpoint, error) {
	cp, err := openCheckpoint(signed, w.verifier, w.origin)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last != nil {
		if err := CheckConsistency(w.last.Tree(), cp.Tree(), consistency); err != nil {
			return nil, err
		}
	}
	w.last = cp
	c := *cp
	return &c, nil
}

// Latest returns the last checkpoint accepted, or nil.
func (w *Witness) Latest() *Checkpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return nil
	}
	c := *w.last
	return &c
}
