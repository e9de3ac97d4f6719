package receipts_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

const origin = "nodelane.test/receipts"

// testLog is a sequenced log in memory and what a verifier needs.
type testLog struct {
	store  *receipts.MemoryStore
	log    *receipts.Log
	seq    *receipts.Sequencer
	signer note.Signer
	vkey   string
	ss     []*receipts.Stored
}

func newTestLog(t testing.TB, n int) *testLog {
	t.Helper()
	skey, vkey, err := receipts.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	store := receipts.NewMemoryStore()
	cfg := &receipts.Config{Origin: origin, Now: func() time.Time { return t0 }}
	seq, err := receipts.NewSequencer(store, signer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := &testLog{store: store, log: receipts.NewLog(store, cfg), seq: seq, signer: signer, vkey: vkey}
	l.add(t, n)
	return l
}

// add mints and sequences n more receipts.
func (l *testLog) add(t testing.TB, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		s, err := l.log.Mint(ctx, receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: fmt.Sprintf("wrk_%d", len(l.ss)+i), Reason: "test"})
		if err != nil {
			t.Fatal(err)
		}
		l.ss = append(l.ss, s)
	}
	for {
		k, err := l.seq.Sequence(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
	}
}

func (l *testLog) proof(t testing.TB, index, size int64) receipts.Proof {
	t.Helper()
	p, err := l.log.InclusionProof(context.Background(), index, size)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (l *testLog) checkpoint(t testing.TB) *receipts.Checkpoint {
	t.Helper()
	cp, err := l.log.Checkpoint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// resign signs body as a note with signer, as a log (ours or another)
// would.
func resign(t *testing.T, body string, signer note.Signer) []byte {
	t.Helper()
	msg, err := note.Sign(&note.Note{Text: body}, signer)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func newSigner(t *testing.T, name string) (note.Signer, string) {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	return s, vkey
}

func TestVerify(t *testing.T) {
	t.Parallel()
	l := newTestLog(t, 10)
	cp := l.checkpoint(t)
	const i = 2
	body := l.ss[i].Body
	good := l.proof(t, i, cp.Size)
	goodBody := string(receipts.FormatCheckpoint(origin, cp.Tree()))

	otherSigner, _ := newSigner(t, origin)
	hs, err := l.store.ReadHashes(context.Background(), []int64{tlog.StoredHashIndex(0, 0), tlog.StoredHashIndex(0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	interior := tlog.NodeHash(hs[0], hs[1])
	leaf0 := l.proof(t, 0, cp.Size)

	// A body that is in the log but not canonical: the log signed it, so
	// only Decode can refuse it.
	junk := []byte(`{"v":1.0}`)
	if err := l.store.AddReceipt(context.Background(), &receipts.Stored{ID: "junk", Kind: receipts.KindNodeAudit, Body: junk}); err != nil {
		t.Fatal(err)
	}
	l.add(t, 0)
	junkCP := l.checkpoint(t)
	junkProof := l.proof(t, cp.Size, junkCP.Size)

	tests := []struct {
		name       string
		key        string
		body       []byte
		proof      receipts.Proof
		checkpoint []byte
		want       error
	}{
		{name: "untouched", want: nil},
		{name: "one flipped byte in the receipt", body: flip(body, len(body)/2), want: receipts.ErrBadProof},
		{name: "one flipped bit in the last byte", body: flipBit(body, len(body)-1), want: receipts.ErrBadProof},
		{name: "wrong index", proof: withIndex(good, i+1), want: receipts.ErrBadProof},
		{name: "a proof hash missing", proof: withHashes(good, good.Hashes[:len(good.Hashes)-1]), want: receipts.ErrBadProof},
		{name: "an extra proof hash", proof: withHashes(good, append(append([]tlog.Hash{}, good.Hashes...), good.Hashes[0])), want: receipts.ErrBadProof},
		{name: "a proof hash changed", proof: withHashes(good, append([]tlog.Hash{{1}}, good.Hashes[1:]...)), want: receipts.ErrBadProof},
		{name: "no proof", proof: withHashes(good, nil), want: receipts.ErrBadProof},
		{name: "index equal to the tree size", proof: withIndex(good, cp.Size), want: receipts.ErrBadProof},
		{name: "index beyond the tree size", proof: withIndex(good, cp.Size+5), want: receipts.ErrBadProof},
		{name: "negative index", proof: withIndex(good, -1), want: receipts.ErrBadProof},
		{name: "proof for another tree size", proof: l.proof(t, i, cp.Size-1), want: receipts.ErrBadProof},
		{name: "interior node passed off as a leaf", body: append([]byte{1}, append(hs[0][:], hs[1][:]...)...),
			proof: withIndex(withHashes(leaf0, leaf0.Hashes[1:]), 0), want: receipts.ErrBadProof},
		{name: "interior node's children passed off as a leaf", body: append(hs[0][:], hs[1][:]...),
			proof: withHashes(leaf0, leaf0.Hashes[1:]), want: receipts.ErrBadProof},
		{name: "interior node hash as the body", body: interior[:], proof: withHashes(leaf0, leaf0.Hashes[1:]), want: receipts.ErrBadProof},
		{name: "checkpoint from an unknown key", checkpoint: resign(t, goodBody, otherSigner), want: receipts.ErrUnknownKey},
		{name: "bad signature from the known key", checkpoint: flipSignature(t, cp.Note), want: receipts.ErrBadSignature},
		{name: "checkpoint body changed under the signature", checkpoint: bytes.Replace(cp.Note, []byte("\n10\n"), []byte("\n11\n"), 1), want: receipts.ErrBadSignature},
		{name: "extra lines in the checkpoint body", checkpoint: resign(t, goodBody+"extension line\n", l.signer), want: receipts.ErrBadCheckpoint},
		{name: "blank extra line in the checkpoint body", checkpoint: resign(t, goodBody+"\n", l.signer), want: receipts.ErrBadCheckpoint},
		{name: "another origin", checkpoint: resign(t, strings.Replace(goodBody, origin, "evil.example/log", 1), l.signer), want: receipts.ErrBadCheckpoint},
		{name: "checkpoint without signatures", checkpoint: []byte(goodBody), want: receipts.ErrBadCheckpoint},
		{name: "checkpoint of a smaller tree", checkpoint: resign(t, string(receipts.FormatCheckpoint(origin, receipts.Tree{Size: 5})), l.signer), want: receipts.ErrBadProof},
		{name: "malformed verifier key", key: "nodelane+00000000+AAAA", want: receipts.ErrInvalidArgument},
		{name: "a logged body that is not canonical", body: junk, proof: junkProof, checkpoint: junkCP.Note, want: receipts.ErrNotCanonical},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key, b, p, c := l.vkey, body, good, cp.Note
			if tc.key != "" {
				key = tc.key
			}
			if tc.body != nil {
				b = tc.body
			}
			if tc.proof.TreeSize != 0 {
				p = tc.proof
			}
			if tc.checkpoint != nil {
				c = tc.checkpoint
			}
			r, err := receipts.Verify(key, origin, b, p, c)
			if tc.want == nil {
				if err != nil || r.ID != l.ss[i].ID {
					t.Fatalf("Verify = %v, %v; want receipt %s", r, err, l.ss[i].ID)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, %v; want %v", r, err, tc.want)
			}
		})
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0xff
	return c
}

func flipBit(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 1
	return c
}

func withIndex(p receipts.Proof, i int64) receipts.Proof {
	p.Index = i
	return p
}

func withHashes(p receipts.Proof, hs []tlog.Hash) receipts.Proof {
	p.Hashes = hs
	return p
}

// flipSignature changes one byte of the Ed25519 signature in a note,
// keeping the key name and hash, so the key is known and its signature
// wrong.
func flipSignature(t *testing.T, msg []byte) []byte {
	t.Helper()
	text, sigs, ok := bytes.Cut(msg, []byte("\n\n"))
	if !ok {
		t.Fatal("no signature block")
	}
	line := strings.TrimSuffix(string(sigs), "\n")
	i := strings.LastIndexByte(line, ' ')
	sig, err := base64.StdEncoding.DecodeString(line[i+1:])
	if err != nil {
		t.Fatal(err)
	}
	sig[10] ^= 1 // past the 4-byte key hash
	return fmt.Appendf(nil, "%s\n\n%s %s\n", text, line[:i], base64.StdEncoding.EncodeToString(sig))
}

func TestWitness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newTestLog(t, 3)
	cp3 := l.checkpoint(t)
	l.add(t, 4)
	cp7 := l.checkpoint(t)
	l.add(t, 6)
	cp13 := l.checkpoint(t)
	consistency := func(old, new int64) []tlog.Hash {
		t.Helper()
		p, err := l.log.ConsistencyProof(ctx, old, new)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	fork := resign(t, string(receipts.FormatCheckpoint(origin, receipts.Tree{Size: cp7.Size, Root: tlog.Hash{7}})), l.signer)
	forkAhead := resign(t, string(receipts.FormatCheckpoint(origin, receipts.Tree{Size: cp13.Size, Root: tlog.Hash{13}})), l.signer)
	other, _ := newSigner(t, origin)

	w, err := receipts.NewWitness(l.vkey, origin, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name        string
		signed      []byte
		consistency []tlog.Hash
		want        error
		latest      int64
	}{
		{"first checkpoint is trusted", cp3.Note, nil, nil, 3},
		{"growth with a consistency proof", cp7.Note, consistency(3, 7), nil, 7},
		{"the same checkpoint again", cp7.Note, nil, nil, 7},
		{"a smaller checkpoint", cp3.Note, nil, receipts.ErrRollback, 7},
		{"same size, another root", fork, nil, receipts.ErrFork, 7},
		{"growth without a proof", cp13.Note, nil, receipts.ErrBadProof, 7},
		{"growth with a proof from another size", cp13.Note, consistency(3, 13), receipts.ErrBadProof, 7},
		{"growth with a changed proof", cp13.Note, append([]tlog.Hash{{9}}, consistency(7, 13)[1:]...), receipts.ErrBadProof, 7},
		{"a fork ahead, with the real proof", forkAhead, consistency(7, 13), receipts.ErrBadProof, 7},
		{"a checkpoint by another key", resign(t, string(receipts.FormatCheckpoint(origin, cp13.Tree())), other), consistency(7, 13), receipts.ErrUnknownKey, 7},
		{"growth with the right proof", cp13.Note, consistency(7, 13), nil, 13},
	}
	for _, s := range steps {
		_, err := w.Update(s.signed, s.consistency)
		if !errors.Is(err, s.want) {
			t.Errorf("%s: Update err = %v, want %v", s.name, err, s.want)
		}
		if got := w.Latest(); got == nil || got.Size != s.latest {
			t.Errorf("%s: Latest = %+v, want the checkpoint of %d", s.name, got, s.latest)
		}
	}

	// A Witness seeded out of band rejects what does not extend the seed.
	seeded, err := receipts.NewWitness(l.vkey, origin, cp7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seeded.Update(cp3.Note, nil); !errors.Is(err, receipts.ErrRollback) {
		t.Errorf("seeded witness took a smaller checkpoint: %v", err)
	}
	if _, err := seeded.Update(cp13.Note, consistency(7, 13)); err != nil {
		t.Errorf("seeded witness: %v", err)
	}
	if _, err := receipts.NewWitness("not a key", origin, nil); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("NewWitness(bad key) err = %v", err)
	}
}

func TestCheckConsistencyEmpty(t *testing.T) {
	t.Parallel()
	l := newTestLog(t, 5)
	cp := l.checkpoint(t)
	if err := receipts.CheckConsistency(receipts.EmptyTree(), cp.Tree(), nil); err != nil {
		t.Errorf("a tree does not extend the empty one: %v", err)
	}
	if err := receipts.CheckConsistency(receipts.Tree{Root: tlog.Hash{1}}, cp.Tree(), nil); !errors.Is(err, receipts.ErrBadProof) {
		t.Errorf("a bad empty root was accepted: %v", err)
	}
	if err := receipts.CheckConsistency(cp.Tree(), cp.Tree(), []tlog.Hash{{}}); !errors.Is(err, receipts.ErrBadProof) {
		t.Errorf("a tree with a proof to itself was accepted: %v", err)
	}
}

func TestParseCheckpoint(t *testing.T) {
	t.Parallel()
	root := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xab}, 32))
	good := origin + "\n42\n" + root + "\n"
	if o, tr, err := receipts.ParseCheckpoint([]byte(good)); err != nil || o != origin || tr.Size != 42 || tr.Root[0] != 0xab {
		t.Fatalf("ParseCheckpoint(good) = %q, %+v, %v", o, tr, err)
	}
	// The last digit before '=' has two bits to spare; canonical base64
	// leaves them zero.
	if root[42] != 's' {
		t.Fatalf("root %s does not end as expected", root)
	}
	nonCanonicalRoot := root[:42] + "t="
	tests := map[string]string{
		"extra line":        good + "ext\n",
		"blank line":        good + "\n",
		"no final newline":  strings.TrimSuffix(good, "\n"),
		"CRLF":              strings.ReplaceAll(good, "\n", "\r\n"),
		"two lines":         origin + "\n42\n",
		"leading zero":      origin + "\n042\n" + root + "\n",
		"plus sign":         origin + "\n+42\n" + root + "\n",
		"negative":          origin + "\n-42\n" + root + "\n",
		"size too big":      origin + "\n9223372036854775808\n" + root + "\n",
		"space in size":     origin + "\n 42\n" + root + "\n",
		"short root":        origin + "\n42\n" + root[4:] + "\n",
		"root without =":    origin + "\n42\n" + strings.TrimSuffix(root, "=") + "\n",
		"non-canonical b64": origin + "\n42\n" + nonCanonicalRoot + "\n",
		"empty origin":      "\n42\n" + root + "\n",
		"origin with space": "a b\n42\n" + root + "\n",
	}
	for name, body := range tests {
		if _, _, err := receipts.ParseCheckpoint([]byte(body)); !errors.Is(err, receipts.ErrBadCheckpoint) {
			t.Errorf("%s: ParseCheckpoint(%q) err = %v, want ErrBadCheckpoint", name, body, err)
		}
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	skey, vkey, err := receipts.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	got, err := receipts.VerifierKey(skey)
	if err != nil || got != vkey {
		t.Fatalf("VerifierKey = %q, %v; want %q", got, err, vkey)
	}
	for _, bad := range []string{"", vkey, "PRIVATE+KEY+x+00000000+AAAA", strings.Replace(skey, origin, "other", 1)} {
		if _, err := receipts.VerifierKey(bad); !errors.Is(err, receipts.ErrInvalidArgument) {
			t.Errorf("VerifierKey(%q) err = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, _, err := receipts.GenerateKey(rand.Reader, "a+b"); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("GenerateKey(a+b) err = %v", err)
	}
	signer, _ := note.NewSigner(skey)
	if _, err := receipts.NewSequencer(receipts.NewMemoryStore(), nil, nil); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("NewSequencer(nil signer) err = %v", err)
	}
	if _, err := receipts.NewSequencer(receipts.NewMemoryStore(), signer, &receipts.Config{Origin: "has space"}); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("NewSequencer(bad origin) err = %v", err)
	}
}
