// Package fingerprint keeps the replicas of one control plane on the same
// secrets. Replicas share one database, and they must share the secrets
// that key what is in it: a replica with another credential pepper
// verifies no token the others minted (and mints tokens they refuse), and
// one with another receipt signing key signs checkpoints of the shared
// log that fail verification with the published key. Both fail silently,
// request by request.
//
// Each replica computes a fingerprint of each secret it holds
// ([Pepper], [ReceiptKey]) and calls [Check] at startup. Check stores the
// fingerprints the database does not have yet (the first replica's win)
// and compares the others: a secret whose fingerprint differs makes Check
// fail with a [*MismatchError] that names it, so the replica refuses to
// start instead of failing request by request.
//
// A fingerprint reveals nothing about its secret: a pepper's is
// HMAC-SHA256 keyed with the pepper over a fixed domain-separation
// string, which is one-way and, without the pepper, unpredictable; the
// receipt key's is SHA-256 of its verifier key, which is public anyway
// (the receipt_public_key third parties verify receipts with). Printing
// or storing a fingerprint is safe.
//
// Peppers rotate (see package credential): a pepper version the database
// does not know yet is added, so a replica started with a new pepper next
// to the old ones starts, and the others learn nothing they must refuse;
// a version the database knows with another value is refused, and the
// replica that holds it adds none of its other fingerprints. A version
// the database knows that the replica does not hold is reported by Check
// (the replica cannot verify tokens minted under it) but not refused, so
// that a retired pepper can be dropped. The receipt signing key does not
// rotate: a log is signed by one key, and another key is refused.
//
// [Check] holds the logic; a Store (MemoryStore here, bunstore for SQLite
// and PostgreSQL) keeps the fingerprints and passes the conformance suite
// in package fingerprinttest.
package fingerprint

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Errors of Check and of stores. Callers test them with errors.Is.
var (
	// ErrMismatch matches every *MismatchError: a secret differs from the
	// one whose fingerprint the database holds.
	ErrMismatch = errors.New("fingerprint: secrets differ from the database's")
	// ErrInvalidArgument means a fingerprint is malformed (see
	// Fingerprint.Validate). Nothing was stored.
	ErrInvalidArgument = errors.New("fingerprint: invalid argument")
	// ErrAborted means the database aborted the transaction the context
	// carries (a deadlock, a serialization failure); nothing of it is
	// kept, and only whoever began it can run it again. Without a
	// transaction in the context, the store's own transaction kept being
	// aborted through its bounded retries.
	ErrAborted = errors.New("fingerprint: transaction aborted")
)

// Kind is what a fingerprint is of.
type Kind string

// The kinds of secret fingerprinted.
const (
	// KindPepper is a credential pepper; its ID is the pepper version.
	KindPepper Kind = "pepper"
	// KindReceiptKey is the receipt signing key; its ID is "".
	KindReceiptKey Kind = "receipt_key"
)

// Limits of a Fingerprint's fields.
const (
	// MaxKindLen and MaxIDLen bound Kind and ID, in bytes.
	MaxKindLen = 32
	MaxIDLen   = 64
	// ValueLen is the length of a Value: SHA-256 in lowercase hex.
	ValueLen = 2 * sha256.Size
)

// Fingerprint is the fingerprint of one secret.
type Fingerprint struct {
	// Kind and ID name the secret; no two stored fingerprints share both.
	Kind Kind
	ID   string
	// Value is the fingerprint: 64 lowercase hex digits.
	Value string
	// CreatedAt is when it was first stored.
	CreatedAt time.Time
}

// Validate reports, with an error that wraps ErrInvalidArgument, a
// fingerprint whose Kind is empty or longer than MaxKindLen, whose ID is
// longer than MaxIDLen, or whose Value is not ValueLen lowercase hex
// digits.
func (f Fingerprint) Validate() error {
	switch {
	case f.Kind == "" || len(f.Kind) > MaxKindLen:
		return fmt.Errorf("%w: kind %q is empty or longer than %d bytes", ErrInvalidArgument, f.Kind, MaxKindLen)
	case len(f.ID) > MaxIDLen:
		return fmt.Errorf("%w: id of %s is longer than %d bytes", ErrInvalidArgument, f.Kind, MaxIDLen)
	case len(f.Value) != ValueLen || strings.Trim(f.Value, "0123456789abcdef") != "":
		return fmt.Errorf("%w: value of %s %q is not %d lowercase hex digits", ErrInvalidArgument, f.Kind, f.ID, ValueLen)
	}
	return nil
}

// Name names the secret for a person: "credential pepper 2", "receipt
// signing key".
func (f Fingerprint) Name() string {
	switch f.Kind {
	case KindPepper:
		return "credential pepper " + f.ID
	case KindReceiptKey:
		return "receipt signing key"
	}
	if f.ID == "" {
		return string(f.Kind)
	}
	return string(f.Kind) + " " + f.ID
}

// pepperDomain is the message a pepper's fingerprint is the HMAC of.
const pepperDomain = "nodelane secret fingerprint v1: credential pepper"

// Pepper returns the fingerprint of the credential pepper of a version:
// HMAC-SHA256 keyed with the pepper over a fixed domain-separation
// string, in hex.
func Pepper(version int, pepper []byte) Fingerprint {
	m := hmac.New(sha256.New, pepper)
	m.Write([]byte(pepperDomain))
	return Fingerprint{Kind: KindPepper, ID: strconv.Itoa(version), Value: hex.EncodeToString(m.Sum(nil))}
}

// ReceiptKey returns the fingerprint of the receipt signing key: SHA-256
// of its note verifier key (receipts.VerifierKey), in hex, as
// `printf %s "$KEY" | sha256sum` prints it.
func ReceiptKey(verifierKey string) Fingerprint {
	sum := sha256.Sum256([]byte(verifierKey))
	return Fingerprint{Kind: KindReceiptKey, Value: hex.EncodeToString(sum[:])}
}

// Store keeps fingerprints. The MemoryStore here and bunstore's
// FingerprintStore implement it; an adapter of one's own must pass
// fingerprinttest.Run, and workerapitest checks that it joins the
// Transactor's transactions.
//
// Transactions and isolation. Add is atomic: it stores all of its
// fingerprints or, when it returns an error, none. When the context
// carries a transaction (how is the adapter's business: bunstore uses
// bunstore.WithTx), Add joins it, sees the fingerprints added in it
// before, and leaves commit and rollback to whoever began it; without
// one, it commits before it returns. READ COMMITTED or stronger is
// enough: a SQL store inserts each absent row with a unique key on (Kind,
// ID) and ignores the conflict (INSERT ... ON CONFLICT DO NOTHING; on
// MySQL and MariaDB, ON DUPLICATE KEY UPDATE id = id, not INSERT IGNORE,
// which hides other errors too), then reads every row, so that concurrent
// Adds agree on whichever committed first.
//
// Ids. Kind and ID are compared and ordered as bytes: case-sensitive, no
// Unicode folding or normalisation, trailing spaces significant ("1" and
// "1 " are two pepper versions). A SQL store gives both columns a binary
// collation that does not pad: COLLATE "C" on PostgreSQL; VARBINARY, or
// utf8mb4_0900_bin on MySQL 8 and utf8mb4_nopad_bin on MariaDB, on MySQL
// and MariaDB (never utf8mb4_bin, which ignores trailing spaces); SQLite's
// default, BINARY, already is one.
//
// Errors. Add returns ErrInvalidArgument as it says, or ErrAborted when
// the database aborted the transaction the context carries, after which
// nothing more of that transaction commits (see workerapi.Transactor). It
// may retry internally, a bounded number of times, only when the context
// carries no transaction.
type Store interface {
	// Add stores each fingerprint of fps whose Kind and ID no stored one
	// has (with its CreatedAt), leaves the stored ones as they are, and
	// returns every stored fingerprint, those just added included, ordered
	// by Kind then ID as bytes; nil, not an empty slice, when none is
	// stored. Add(ctx, nil) is the read. Concurrent calls agree:
	// whichever stores a Kind and ID first, every call returns its Value.
	// A malformed fingerprint (see Fingerprint.Validate), or two in fps
	// with the same Kind and ID, make it fail with ErrInvalidArgument and
	// store nothing.
	Add(ctx context.Context, fps []Fingerprint) ([]Fingerprint, error)
}

// Mismatch is one secret that differs from the database's.
type Mismatch struct {
	Kind Kind
	ID   string
	// Have is the fingerprint of the secret given to Check; Stored the
	// database's.
	Have, Stored string
}

// MismatchError reports the secrets that differ from the database's.
// Its message names each and shows the two fingerprints, never a secret.
type MismatchError struct {
	Mismatches []Mismatch
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	b.WriteString("secrets differ from the database's (another replica's secrets file?): ")
	for i, m := range e.Mismatches {
		if i > 0 {
			b.WriteString("; ")
		}
		what := "fingerprint"
		if m.Kind == KindReceiptKey {
			what = "verifier key fingerprint"
		}
		fmt.Fprintf(&b, "%s (%s %s here, %s in the database)", Fingerprint{Kind: m.Kind, ID: m.ID}.Name(), what, short(m.Have), short(m.Stored))
	}
	return b.String()
}

// Is makes errors.Is(err, ErrMismatch) hold for every MismatchError.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// short is the first 16 hex digits of a fingerprint, enough to tell two
// apart.
func short(v string) string {
	if len(v) > 16 {
		return v[:16]
	}
	return v
}

// Check compares have with the fingerprints st holds, then adds those of
// have that st has none of (same Kind and ID) and compares again. If one
// differs it returns a *MismatchError naming every one that differs
// (errors.Is(err, ErrMismatch)); a replica whose secrets differ from the
// stored ones adds none of its own, so that it cannot claim a new pepper
// version for its wrong secrets file. The second comparison catches a
// replica that added the same Kind and ID in between. Otherwise Check
// returns the stored fingerprints of the kinds in have that have does not
// hold (a pepper version the replica lacks, say), for the caller to
// report.
func Check(ctx context.Context, st Store, have []Fingerprint) (unheld []Fingerprint, err error) {
	if err := ValidateAll(have); err != nil {
		return nil, err
	}
	stored, err := st.Add(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := compare(stored, have, false); err != nil {
		return nil, err
	}
	if stored, err = st.Add(ctx, have); err != nil {
		return nil, err
	}
	return compare(stored, have, true)
}

// compare returns a *MismatchError for the fingerprints of have whose
// stored value differs, or else the stored fingerprints of have's kinds
// that have lacks. With all, every fingerprint of have must be stored.
func compare(stored, have []Fingerprint, all bool) (unheld []Fingerprint, err error) {
	type key struct {
		kind Kind
		id   string
	}
	byKey := make(map[key]string, len(stored))
	for _, f := range stored {
		byKey[key{f.Kind, f.ID}] = f.Value
	}
	var mm []Mismatch
	held := make(map[key]bool, len(have))
	kinds := make(map[Kind]bool, len(have))
	for _, f := range have {
		held[key{f.Kind, f.ID}], kinds[f.Kind] = true, true
		v, ok := byKey[key{f.Kind, f.ID}]
		switch {
		case !ok && all:
			return nil, fmt.Errorf("fingerprint: the store returned no fingerprint of %s after adding it", f.Name())
		case ok && !hmac.Equal([]byte(v), []byte(f.Value)):
			mm = append(mm, Mismatch{Kind: f.Kind, ID: f.ID, Have: f.Value, Stored: v})
		}
	}
	if len(mm) > 0 {
		return nil, &MismatchError{Mismatches: mm}
	}
	for _, f := range stored {
		if kinds[f.Kind] && !held[key{f.Kind, f.ID}] {
			unheld = append(unheld, f)
		}
	}
	return unheld, nil
}

// ValidateAll validates each of fps (see Fingerprint.Validate) and
// reports two with the same Kind and ID, with an error that wraps
// ErrInvalidArgument. Stores call it before they store anything.
func ValidateAll(fps []Fingerprint) error {
	seen := make(map[Fingerprint]bool, len(fps))
	for _, f := range fps {
		if err := f.Validate(); err != nil {
			return err
		}
		k := Fingerprint{Kind: f.Kind, ID: f.ID}
		if seen[k] {
			return fmt.Errorf("%w: %s is given twice", ErrInvalidArgument, f.Name())
		}
		seen[k] = true
	}
	return nil
}
