package nodelane_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/crc32"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
)

// The worked examples of docs/PROTOCOL.md are computed here by the real
// code (replay's Signer and Verifier, receipts' canonical encoder, Log,
// Sequencer and checkpoint signing, golang.org/x/mod's tlog and note),
// and each must appear, byte for byte, in the fenced block that follows
// its marker line "<!-- example: NAME -->" in the page. The tests also
// check the page's rules by independent implementations written from the
// page alone (signature base, token shape, canonical JSON, RFC 9162
// proof verification, signed-note verification), so that a worker
// written from the page in another language interoperates.
//
// To see every block as the code computes it, run
//
//	PROTOCOL_DOC_DUMP=/tmp/blocks.md go test -run Protocol .

const protocolDocPath = "docs/PROTOCOL.md"

// docExample is one worked example: its marker name and its exact text.
type docExample struct {
	name string
	text string
}

// exampleMarker starts the line before the fence of a worked example.
const exampleMarker = "<!-- example: "

// docExampleBlocks returns the fenced block after each example marker of
// doc, by name. The block is the text between the fence lines, each line
// ending in LF.
func docExampleBlocks(doc string) (map[string]string, error) {
	lines := strings.Split(doc, "\n")
	out := map[string]string{}
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, exampleMarker) {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(l, exampleMarker), " -->")
		if name == l || strings.ContainsAny(name, " <>") {
			return nil, fmt.Errorf("line %d: malformed example marker %q", i+1, l)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("line %d: example %q is marked twice", i+1, name)
		}
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j == len(lines) || !strings.HasPrefix(lines[j], "```") {
			return nil, fmt.Errorf("line %d: example %q is not followed by a fenced block", i+1, name)
		}
		var b strings.Builder
		k := j + 1
		for ; k < len(lines) && lines[k] != "```"; k++ {
			b.WriteString(lines[k])
			b.WriteByte('\n')
		}
		if k == len(lines) {
			return nil, fmt.Errorf("line %d: the block of example %q is not closed", j+1, name)
		}
		out[name] = b.String()
		i = k
	}
	return out, nil
}

func TestProtocolDocExamples(t *testing.T) {
	raw, err := os.ReadFile(protocolDocPath)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docExampleBlocks(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	examples := protocolExamples(t)
	if path := os.Getenv("PROTOCOL_DOC_DUMP"); path != "" {
		var b strings.Builder
		for _, e := range examples {
			fmt.Fprintf(&b, "%s%s -->\n```\n%s```\n\n", exampleMarker, e.name, e.text)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	known := map[string]bool{}
	for _, e := range examples {
		known[e.name] = true
		got, ok := blocks[e.name]
		switch {
		case !ok:
			t.Errorf("%s has no block marked %q; the code computes:\n%s", protocolDocPath, e.name, e.text)
		case got != e.text:
			t.Errorf("%s: example %q disagrees with the code.\nThe page has:\n%s\nThe code computes:\n%s", protocolDocPath, e.name, got, e.text)
		}
	}
	for name := range blocks {
		if !known[name] {
			t.Errorf("%s: example %q is not computed by this test", protocolDocPath, name)
		}
	}
}

// protocolExamples computes every worked example of the page, in page
// order, checking each against the code as it goes.
func protocolExamples(t *testing.T) []docExample {
	t.Helper()
	var ex []docExample
	ex = append(ex, tokenExamples(t)...)
	ex = append(ex, signingExamples(t)...)
	ex = append(ex, receiptExamples(t)...)
	return ex
}

// Tokens.

const base62Digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// base62Fixed writes v as exactly n base62 digits, most significant first,
// as the page says.
func base62Fixed(v *big.Int, n int) string {
	v = new(big.Int).Set(v)
	b := make([]byte, n)
	r := new(big.Int)
	for i := n - 1; i >= 0; i-- {
		v.QuoRem(v, big.NewInt(62), r)
		b[i] = base62Digits[r.Int64()]
	}
	return string(b)
}

// pageToken builds a token as the page describes: prefix, the payload as
// a big-endian number in bodyLen base62 digits, then the CRC-32 (IEEE) of
// everything before it in 6 base62 digits.
func pageToken(prefix string, payload []byte, bodyLen int) string {
	head := prefix + base62Fixed(new(big.Int).SetBytes(payload), bodyLen)
	return head + base62Fixed(big.NewInt(int64(crc32.ChecksumIEEE([]byte(head)))), 6)
}

// exampleCredential is the credential of credential/testdata/vectors.json:
// id 00..0f, secret 20..3f.
func exampleCredential(t *testing.T) (id, secret []byte, token string) {
	t.Helper()
	id, secret = seq(0x00, 16), seq(0x20, 32)
	token = pageToken(credential.TokenPrefix, append(slices.Clone(id), secret...), 65)
	got, err := credential.ParseToken(token)
	if err != nil || got != hex.EncodeToString(id) {
		t.Fatalf("the page's credential token %s: credential.ParseToken = %q, %v", token, got, err)
	}
	if len(token) != credential.TokenLen || credential.TokenPattern.FindString(token) != token {
		t.Fatalf("the page's credential token %s has the wrong shape", token)
	}
	var vec struct {
		Token string `json:"token"`
	}
	b, err := os.ReadFile("credential/testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &vec); err != nil || vec.Token != token {
		t.Fatalf("credential/testdata/vectors.json has token %q, the page's rules give %q (%v)", vec.Token, token, err)
	}
	return id, secret, token
}

func seq(from byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}

func tokenExamples(t *testing.T) []docExample {
	id, secret, token := exampleCredential(t)
	text := fmt.Sprintf(`id (16 bytes):      %x
secret (32 bytes):  %x
body (65 digits):   %s
checksum (6):       %s  (CRC-32/IEEE of %q + body = %d)
token (%d chars):   %s
credential_id:      %x
`, id, secret, token[4:69], token[69:], credential.TokenPrefix, crc32.ChecksumIEEE([]byte(token[:69])), len(token), token, id)
	return []docExample{{"credential-token", text}}
}

// Signing.

// The RFC 9421 Appendix B.1.4 key "test-key-ed25519", the key of
// replay/testdata/*.txt.
const exampleSeedHex = "9f8362f87a484a954e6e740c5b4c0e84229139a20aa8ab56ff66586f6a7d29c5"

func exampleNodeKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	seed, err := hex.DecodeString(exampleSeedHex)
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// The register request of the page.
var (
	exampleCreated = time.Date(2026, 11, 30, 8, 59, 0, 0, time.UTC)
	exampleNonce   = []byte{0x6e, 0x6f, 0x64, 0x65, 0x6c, 0x61, 0x6e, 0x65, 0x2d, 0x6e, 0x6f, 0x6e, 0x63, 0x65, 0x2d, 0x31}
)

const exampleAuthority = "cp.example.com"

func exampleRegisterBody(pub ed25519.PublicKey) []byte {
	return []byte(`{"node_id":"studio-gpu-1","name":"Studio-GPU","hostname":"studio.local","role":"local_gpu_compute",` +
		`"capabilities":{"gpus":[{"sku":"rtx-4090","vram_mb":24576}],"job_types":["embedding_dry_run","lora_train"]},` +
		`"governor_limits":{"max_jobs":2,"max_vram_mb":24576},"version":"worker/1.0.0","heartbeat_interval_seconds":30,` +
		`"public_key":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}`)
}

// pageSignatureBase builds the signature base of a profile signature from
// the page's rules alone.
func pageSignatureBase(method, authority, target, contentDigest, contentType, params string) string {
	path, query, _ := strings.Cut(target, "?")
	return `"@method": ` + method + "\n" +
		`"@authority": ` + authority + "\n" +
		`"@path": ` + path + "\n" +
		`"@query": ?` + query + "\n" +
		`"content-digest": ` + contentDigest + "\n" +
		`"content-type": ` + contentType + "\n" +
		`"@signature-params": ` + params
}

func signingExamples(t *testing.T) []docExample {
	t.Helper()
	key := exampleNodeKey(t)
	pub := key.Public().(ed25519.PublicKey)
	_, _, token := exampleCredential(t)

	// The key, in the forms the page shows, and the one replay/testdata
	// uses.
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	vectors, err := os.ReadFile("replay/testdata/rfc9421-b26-ed25519.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(vectors, pemKey) {
		t.Fatalf("replay/testdata/rfc9421-b26-ed25519.txt does not hold the page's key\n%s", pemKey)
	}
	sum := sha256.Sum256(pub)
	keyID := base64.RawURLEncoding.EncodeToString(sum[:])
	if keyID != replay.KeyID(pub) || keyID != credential.KeyID(pub) {
		t.Fatalf("keyid %s disagrees with replay.KeyID %s or credential.KeyID %s", keyID, replay.KeyID(pub), credential.KeyID(pub))
	}
	keyText := fmt.Sprintf(`Ed25519 private key, PKCS#8 PEM:
%sseed (32 bytes, hex):        %s
public key (32 bytes, hex):  %x
public_key (base64url, no padding, 43 chars):
  %s
keyid = base64url(SHA-256(public key)), no padding:
  %s
`, pemKey, exampleSeedHex, []byte(pub), base64.RawURLEncoding.EncodeToString(pub), keyID)

	// The request, signed by the worker's Signer.
	body := exampleRegisterBody(pub)
	r := httptest.NewRequest(http.MethodPost, "/workers/register", bytes.NewReader(body))
	r.Host = exampleAuthority
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Content-Type", "application/json")
	signer := replay.NewSigner(key, nil)
	if err := signer.SignAt(r, body, exampleCreated, exampleNonce); err != nil {
		t.Fatal(err)
	}
	cd, si, sg := r.Header.Get("Content-Digest"), r.Header.Get("Signature-Input"), r.Header.Get("Signature")
	reqText := fmt.Sprintf("POST /workers/register HTTP/1.1\nHost: %s\nAuthorization: Bearer %s\nContent-Type: application/json\nContent-Length: %d\nContent-Digest: %s\nSignature-Input: %s\nSignature: %s\n\n%s\n",
		exampleAuthority, token, len(body), cd, si, sg, body)

	// The same request built as a client builds it signs the same.
	cr, err := http.NewRequest(http.MethodPost, "https://"+exampleAuthority+"/workers/register", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	cr.Header.Set("Content-Type", "application/json")
	if err := signer.SignAt(cr, body, exampleCreated, exampleNonce); err != nil {
		t.Fatal(err)
	}
	if cr.Header.Get("Signature") != sg || cr.Header.Get("Signature-Input") != si {
		t.Fatalf("a client request signs differently from the request as the server receives it")
	}

	// The server accepts it once, within the window.
	v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return exampleCreated.Add(5 * time.Second) }})
	if _, err := v.Verify(context.Background(), r, body, "wrk_example", pub); err != nil {
		t.Fatalf("the page's signed request does not verify: %v", err)
	}
	if _, err := v.Verify(context.Background(), r, body, "wrk_example", pub); !errors.Is(err, replay.ErrReplayedNonce) {
		t.Fatalf("the page's signed request, sent twice: %v, want ErrReplayedNonce", err)
	}

	// The window the page states for it: from created - 300 s up to, not
	// including, expires.
	for _, c := range []struct {
		at   time.Time
		want error
	}{
		{exampleCreated.Add(-300 * time.Second), nil},
		{exampleCreated.Add(300*time.Second - time.Microsecond), nil},
		{exampleCreated.Add(-300*time.Second - time.Microsecond), replay.ErrStaleTimestamp},
		{exampleCreated.Add(300 * time.Second), replay.ErrStaleTimestamp},
	} {
		v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return c.at }})
		if _, err := v.Check(r, body, pub); !errors.Is(err, c.want) && !(c.want == nil && err == nil) {
			t.Fatalf("the page's request checked at %s: %v, want %v", c.at.Format(time.RFC3339Nano), err, c.want)
		}
	}

	// The signature base, by replay and by the page's rules.
	sig, err := replay.ParseSignature(r.Header, replay.Label)
	if err != nil {
		t.Fatal(err)
	}
	base, err := replay.SignatureBase(r, sig.Params)
	if err != nil {
		t.Fatal(err)
	}
	params := strings.TrimPrefix(si, replay.Label+"=")
	digest := sha256.Sum256(body)
	wantCD := "sha-256=:" + base64.StdEncoding.EncodeToString(digest[:]) + ":"
	wantParams := fmt.Sprintf(`("@method" "@authority" "@path" "@query" "content-digest" "content-type");created=%d;expires=%d;nonce="%s";keyid="%s";tag="%s"`,
		exampleCreated.Unix(), exampleCreated.Unix()+300, base64.RawURLEncoding.EncodeToString(exampleNonce), keyID, replay.Tag)
	pageBase := pageSignatureBase("POST", exampleAuthority, "/workers/register", wantCD, "application/json", wantParams)
	switch {
	case cd != wantCD:
		t.Fatalf("Content-Digest %s, the page's rule gives %s", cd, wantCD)
	case params != wantParams:
		t.Fatalf("Signature-Input %s, the page's rules give %s", params, wantParams)
	case string(base) != pageBase:
		t.Fatalf("signature base:\n%s\nthe page's rules give:\n%s", base, pageBase)
	case !ed25519.Verify(pub, []byte(pageBase), sig.Value):
		t.Fatal("the signature does not verify over the page's signature base")
	case sg != replay.Label+"=:"+base64.StdEncoding.EncodeToString(ed25519.Sign(key, []byte(pageBase)))+":":
		t.Fatal("Signature is not the Ed25519 signature of the base in a byte sequence")
	}
	paramText := fmt.Sprintf(`created = %d  (%s)
expires = %d  (created + 300)
nonce   = %s  (16 bytes, hex %x)
keyid   = %s
tag     = %s
`, exampleCreated.Unix(), exampleCreated.Format(time.RFC3339), exampleCreated.Unix()+300,
		base64.RawURLEncoding.EncodeToString(exampleNonce), exampleNonce, keyID, replay.Tag)
	return []docExample{
		{"signing-key", keyText},
		{"signature-params", paramText},
		{"signed-request", reqText},
		{"signature-base", string(base) + "\n"},
	}
}

// TestProtocolSignatureRules checks the profile rules the page states,
// one changed request at a time, against replay's Verifier.
func TestProtocolSignatureRules(t *testing.T) {
	key := exampleNodeKey(t)
	pub := key.Public().(ed25519.PublicKey)
	now := exampleCreated.Add(5 * time.Second)
	nonce := base64.RawURLEncoding.EncodeToString(exampleNonce)
	keyID := replay.KeyID(pub)
	body := []byte(`{"status":"idle"}`)

	type input struct {
		target, contentDigest string
		params                string // after the component list
		sign                  bool   // sign the base; otherwise reuse a bad signature
	}
	comps := `("@method" "@authority" "@path" "@query" "content-digest" "content-type")`
	good := fmt.Sprintf(`;created=%d;expires=%d;nonce="%s";keyid="%s";tag="nodelane-worker/v1"`, exampleCreated.Unix(), exampleCreated.Unix()+300, nonce, keyID)
	sha256CD, _ := replay.ContentDigest(replay.DigestSHA256, body)
	sha512CD, _ := replay.ContentDigest(replay.DigestSHA512, body)
	otherCD, _ := replay.ContentDigest(replay.DigestSHA256, []byte(`{"status":"busy"}`))
	build := func(in input, compList string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, in.target, bytes.NewReader(body))
		r.Host = exampleAuthority
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Content-Digest", in.contentDigest)
		p := compList + in.params
		r.Header.Set("Signature-Input", "nodelane="+p)
		path, query, _ := strings.Cut(in.target, "?")
		base := `"@method": POST` + "\n" + `"@authority": ` + exampleAuthority + "\n" + `"@path": ` + path + "\n" +
			`"@query": ?` + query + "\n" + `"content-digest": ` + in.contentDigest + "\n" + `"content-type": application/json` + "\n" +
			`"@signature-params": ` + p
		r.Header.Set("Signature", "nodelane=:"+base64.StdEncoding.EncodeToString(ed25519.Sign(key, []byte(base)))+":")
		return r
	}
	for _, c := range []struct {
		name   string
		in     input
		comps  string
		want   error
		mutate func(r *http.Request)
	}{
		{name: "as signed", in: input{"/workers/heartbeat", sha256CD, good, true}},
		{name: "query as sent", in: input{"/api/nl/workers/heartbeat?a=1&b=%2F", sha256CD, good, true}},
		{name: "sha-512 digest", in: input{"/workers/heartbeat", sha512CD, good, true}},
		{name: "both digests", in: input{"/workers/heartbeat", sha256CD + ", " + sha512CD, good, true}},
		{name: "parameters in another order", in: input{"/workers/heartbeat", sha256CD,
			fmt.Sprintf(`;tag="nodelane-worker/v1";keyid="%s";nonce="%s";expires=%d;created=%d`, keyID, nonce, exampleCreated.Unix()+300, exampleCreated.Unix()), true}},
		{name: "64-byte nonce", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, nonce, base64.RawURLEncoding.EncodeToString(seq(1, 64)), 1), true}},
		{name: "15-byte nonce", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, nonce, base64.RawURLEncoding.EncodeToString(seq(1, 15)), 1), true}, want: replay.ErrMalformedSignature},
		{name: "65-byte nonce", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, nonce, base64.RawURLEncoding.EncodeToString(seq(1, 65)), 1), true}, want: replay.ErrMalformedSignature},
		{name: "padded nonce", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, nonce, base64.URLEncoding.EncodeToString(exampleNonce), 1), true}, want: replay.ErrMalformedSignature},
		{name: "standard-alphabet nonce", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, nonce, base64.RawStdEncoding.EncodeToString(seq(0xf8, 16)), 1), true}, want: replay.ErrMalformedSignature},
		{name: "non-canonical nonce", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, nonce, nonce[:len(nonce)-1]+"x", 1), true}, want: replay.ErrMalformedSignature},
		{name: "alg parameter", in: input{"/workers/heartbeat", sha256CD, good + `;alg="ed25519"`, true}, want: replay.ErrMalformedSignature},
		{name: "other tag", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, "nodelane-worker/v1", "nodelane-worker/v2", 1), true}, want: replay.ErrMalformedSignature},
		{name: "no keyid", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, `;keyid="`+keyID+`"`, "", 1), true}, want: replay.ErrMalformedSignature},
		{name: "components in another order", in: input{"/workers/heartbeat", sha256CD, good, true},
			comps: `("@authority" "@method" "@path" "@query" "content-digest" "content-type")`, want: replay.ErrMalformedSignature},
		{name: "duplicate digest member", in: input{"/workers/heartbeat", sha256CD + ", " + sha256CD, good, true}, want: replay.ErrMalformedSignature},
		{name: "md5 digest", in: input{"/workers/heartbeat", "md5=:AAAAAAAAAAAAAAAAAAAAAA==:", good, true}, want: replay.ErrBadDigest},
		{name: "digest of another body", in: input{"/workers/heartbeat", otherCD, good, true}, want: replay.ErrBadDigest},
		{name: "one digest of two wrong", in: input{"/workers/heartbeat", sha512CD + ", " + otherCD, good, true}, want: replay.ErrBadDigest},
		{name: "other keyid", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, keyID, replay.KeyID(make([]byte, 32)), 1), true}, want: replay.ErrBadSignature},
		{name: "expires past the window", in: input{"/workers/heartbeat", sha256CD, strings.Replace(good, strconv.FormatInt(exampleCreated.Unix()+300, 10), strconv.FormatInt(exampleCreated.Unix()+301, 10), 1), true}, want: replay.ErrStaleTimestamp},
		{name: "missing Content-Digest", in: input{"/workers/heartbeat", sha256CD, good, true}, want: replay.ErrMissingSignature,
			mutate: func(r *http.Request) { r.Header.Del("Content-Digest") }},
		{name: "second Signature-Input line with the label", in: input{"/workers/heartbeat", sha256CD, good, true}, want: replay.ErrMalformedSignature,
			mutate: func(r *http.Request) { r.Header.Add("Signature-Input", r.Header.Get("Signature-Input")) }},
		{name: "a signature of another label beside", in: input{"/workers/heartbeat", sha256CD, good, true},
			mutate: func(r *http.Request) {
				r.Header.Add("Signature-Input", `proxy=("@method");created=1`)
				r.Header.Add("Signature", `proxy=:AAAA:`)
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := comps
			if c.comps != "" {
				cl = c.comps
			}
			r := build(c.in, cl)
			if c.mutate != nil {
				c.mutate(r)
			}
			v := replay.NewVerifier(replay.NewMemoryStore(nil), &replay.VerifierConfig{Now: func() time.Time { return now }})
			_, err := v.Verify(context.Background(), r, body, "wrk_example", pub)
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
		})
	}
}

// Receipts.

// The page's story: worker_registered, then a job's job_completed and
// job_charged, in a new log.
var (
	exampleRegistered = time.Date(2026, 11, 30, 8, 59, 0, 250000000, time.UTC)
	exampleAccepted   = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	exampleFinished   = time.Date(2026, 11, 30, 9, 0, 1, 234000000, time.UTC)
)

// exampleID is an id in the form the control plane makes: prefix, then
// 48 bits of Unix milliseconds and 80 more bits, in hex.
func exampleID(prefix string, at time.Time, tail string) string {
	var b [6]byte
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	return prefix + hex.EncodeToString(b[:]) + tail
}

func exampleReceipts(t *testing.T) []receipts.Receipt {
	t.Helper()
	pub := exampleNodeKey(t).Public().(ed25519.PublicKey)
	workerID := exampleID("wrk_", exampleRegistered, "3c1f0a9e5d7b2c48e610")
	jobID := exampleID("job_", exampleAccepted.Add(-40*time.Second), "a41d7c09b3e2f6158d27")
	leaseID := exampleID("lse_", exampleAccepted.Add(-2*time.Second), "5e0b9f3a7c2d4e1f6a80")
	completedID := exampleID("rcp_", exampleFinished, "c7e2a19f0b4d3e8a5f16")
	metrics, err := receipts.PayloadSHA256(json.RawMessage(`{"loss": 0.12}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256([]byte(`{"loss":0.12}`)); metrics != hex.EncodeToString(want[:]) {
		t.Fatalf("PayloadSHA256 is not the SHA-256 of the compacted JSON")
	}
	charge, err := receipts.NewCharge(exampleAccepted, exampleFinished, 1, 1_802_000)
	if err != nil {
		t.Fatal(err)
	}
	charged := charge.Receipt(jobID, workerID, "rtx-4090")
	charged.ID, charged.LeaseID, charged.PolicyVersion, charged.ServerTime = completedID+".charge", leaseID, 3, exampleFinished
	return []receipts.Receipt{
		{
			ID: exampleID("rcp_", exampleRegistered, "0d9e4b7a1c6f2e3a8b05"), Kind: receipts.KindWorkerRegistered, PolicyVersion: 3, ServerTime: exampleRegistered,
			WorkerID: workerID, NodeID: "studio-gpu-1", KeyID: replay.KeyID(pub), CredentialID: "9b2f6c1e8d4a7035b1e9f2c6d8a4e017",
			// The provisioning token of section 2.1, which the request of 4.7 carries.
			ProvisioningCredentialID: "000102030405060708090a0b0c0d0e0f",
		},
		{
			ID: completedID, Kind: receipts.KindJobCompleted, PolicyVersion: 3, ServerTime: exampleFinished,
			JobID: jobID, WorkerID: workerID, JobType: "embedding_dry_run", LeaseEpoch: 1, LeaseID: leaseID, Attempt: 1,
			StartedAt: exampleAccepted, EndedAt: exampleFinished, OutputURI: "s3://bucket/embeddings/run-7/", MetricsSHA256: metrics,
			ActualMS: charge.ActualMS, GPUCount: charge.GPUCount, Charged: receipts.ChargedYes,
		},
		charged,
	}
}

// pageCanonical encodes a flat object by the page's rules: members sorted
// by key in byte order, no whitespace, strings escaped as RFC 8785 does.
func pageCanonical(m map[string]any) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	str := func(s string) string {
		var b strings.Builder
		b.WriteByte('"')
		for _, r := range s {
			switch {
			case r == '"' || r == '\\':
				b.WriteByte('\\')
				b.WriteRune(r)
			case r == '\b':
				b.WriteString(`\b`)
			case r == '\t':
				b.WriteString(`\t`)
			case r == '\n':
				b.WriteString(`\n`)
			case r == '\f':
				b.WriteString(`\f`)
			case r == '\r':
				b.WriteString(`\r`)
			case r < 0x20:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				b.WriteRune(r)
			}
		}
		b.WriteByte('"')
		return b.String()
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(str(k) + ":")
		switch v := m[k].(type) {
		case string:
			b.WriteString(str(v))
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		default:
			panic(fmt.Sprintf("%s: %T", k, v))
		}
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// reencode checks body against the page's encoding rules: it decodes it
// as JSON (numbers as int64) and encodes it again by those rules.
func reencode(t *testing.T, body []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	for k, v := range m {
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			m[k] = i
		}
	}
	if got := pageCanonical(m); !bytes.Equal(got, body) {
		t.Fatalf("canonical bytes:\n%s\nthe page's rules give:\n%s", body, got)
	}
}

// exampleLogKey is the note key that signs the example checkpoints, named
// after the origin as the page requires: its Ed25519 seed is 32 bytes
// 0x40..0x5f.
func exampleLogKey(t *testing.T) (signerKey, verifierKey string) {
	t.Helper()
	signerKey, verifierKey, err := receipts.GenerateKey(bytes.NewReader(seq(0x40, 32)), receipts.DefaultOrigin)
	if err != nil {
		t.Fatal(err)
	}
	return signerKey, verifierKey
}

func receiptExamples(t *testing.T) []docExample {
	t.Helper()
	ctx := context.Background()
	rs := exampleReceipts(t)
	bodies := make([][]byte, len(rs))
	for i := range rs {
		b, err := rs[i].Encode()
		if err != nil {
			t.Fatal(err)
		}
		reencode(t, b)
		if _, err := receipts.Decode(b); err != nil {
			t.Fatal(err)
		}
		bodies[i] = b
	}
	var ex []docExample
	for i, name := range []string{"receipt-worker-registered", "receipt-job-completed", "receipt-job-charged"} {
		ex = append(ex, docExample{name, string(bodies[i]) + "\n"})
	}

	// Escapes.
	esc := receipts.Receipt{
		ID: exampleID("rcp_", exampleFinished.Add(time.Hour), "77aa0e3c91d24b6f8e05"), Kind: receipts.KindCredentialRevoked, PolicyVersion: 3,
		ServerTime: exampleFinished.Add(time.Hour), CredentialID: "000102030405060708090a0b0c0d0e0f", PrincipalID: "operator",
		Actor: "operator", Reason: "token \"pasted\" in C:\\ci\\log\tline 3\nsee https://ex.example/é\x01",
	}
	eb, err := esc.Encode()
	if err != nil {
		t.Fatal(err)
	}
	reencode(t, eb)
	ex = append(ex, docExample{"receipt-escapes", string(eb) + "\n"})

	// A worker that restarted with a new job type, a second GPU and
	// max_jobs 2 (worker_updated).
	upd := receipts.Receipt{
		ID: exampleID("rcp_", exampleFinished.Add(2*time.Hour), "3c5e7a9b1d2f4e6a8c0b"), Kind: receipts.KindWorkerUpdated, PolicyVersion: 3,
		ServerTime: exampleFinished.Add(2 * time.Hour), WorkerID: "wrk_01a22badcd1a3c1f0a9e5d7b2c48e610", NodeID: "studio-gpu-1",
		OldJobTypes: "embedding_dry_run", JobTypes: "embedding_dry_run lora_train", OldTags: "lab", Tags: "lab",
		OldGPUs: "rtx-4090:24576", GPUs: "rtx-4090:24576 rtx-4090:24576", OldMaxJobs: 1, MaxJobs: 2,
	}
	ub, err := upd.Encode()
	if err != nil {
		t.Fatal(err)
	}
	reencode(t, ub)
	ex = append(ex, docExample{"receipt-worker-updated", string(ub) + "\n"})
	// The ends of leases that the control plane makes: a lease that ran
	// past its TTL after accept (600 s and 1.5 ms of GPU time on one GPU,
	// uncharged), and one never accepted (no started_at, no actual_ms).
	workerID := rs[0].WorkerID
	expiredAt := exampleFinished.Add(time.Hour)
	accepted := expiredAt.Add(-600*time.Second - 1500*time.Microsecond)
	expired := receipts.Receipt{
		ID: exampleID("rcp_", expiredAt, "5b2e9c0d7a4f1e3b6c80"), Kind: receipts.KindJobFailed, PolicyVersion: 3, ServerTime: expiredAt,
		JobID: exampleID("job_", accepted.Add(-time.Minute), "1f4e7a2b9c3d5e6f7081"), WorkerID: workerID, JobType: "embedding_dry_run",
		LeaseEpoch: 1, LeaseID: exampleID("lse_", accepted.Add(-time.Second), "2a3b4c5d6e7f80910a1b"), Attempt: 1,
		ErrorCode: "lease_expired", Outcome: receipts.OutcomeRequeued, StartedAt: accepted, EndedAt: expiredAt,
		GPUCount: 1, Charged: receipts.ChargedNo,
	}
	if expired.ActualMS, err = receipts.DurationMS(accepted, expiredAt); err != nil || expired.ActualMS != 600_002 {
		t.Fatalf("DurationMS = %d, %v; want 600002 (rounded up)", expired.ActualMS, err)
	}
	timedOut := expired
	timedOut.ID, timedOut.ErrorCode, timedOut.StartedAt, timedOut.ActualMS = exampleID("rcp_", expiredAt, "6c3f0d1e8b5a2f4c7d91"), "accept_timeout", time.Time{}, 0
	timedOut.LeaseEpoch, timedOut.LeaseID = 2, exampleID("lse_", expiredAt.Add(-time.Minute), "3b4c5d6e7f8091a2b3c4")
	for _, e := range []struct {
		name string
		r    receipts.Receipt
	}{{"receipt-job-failed-expired", expired}, {"receipt-job-failed-accept-timeout", timedOut}} {
		b, err := e.r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		reencode(t, b)
		if _, err := receipts.Decode(b); err != nil {
			t.Fatal(err)
		}
		ex = append(ex, docExample{e.name, string(b) + "\n"})
	}

	// The leaf hash of the job_charged receipt.
	leaf := tlog.RecordHash(bodies[2])
	if h := sha256.Sum256(append([]byte{0}, bodies[2]...)); h != leaf {
		t.Fatal("tlog.RecordHash is not SHA-256(0x00 || body)")
	}
	ex = append(ex, docExample{"leaf-hash", fmt.Sprintf(`body (base64, as "body" carries it):
%s
leaf hash = SHA-256(0x00 || canonical bytes)
  hex:    %x
  base64: %s
`, wrap(base64.StdEncoding.EncodeToString(bodies[2]), 76), leaf[:], base64.StdEncoding.EncodeToString(leaf[:]))})

	// The log, sequenced and signed by the real Log and Sequencer.
	skey, vkey := exampleLogKey(t)
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	store := receipts.NewMemoryStore()
	cfg := &receipts.Config{Now: func() time.Time { return exampleFinished }}
	log := receipts.NewLog(store, cfg)
	seqr, err := receipts.NewSequencer(store, signer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if _, err := log.Mint(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := seqr.Sequence(ctx); err != nil || n != 3 {
		t.Fatalf("Sequence = %d, %v", n, err)
	}
	// The complete answer: job_completed and job_charged, in this order,
	// each with its proof against one checkpoint.
	ss, proofs, cp, err := log.Await(ctx, rs[1].ID, rs[2].ID)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range ss {
		if !bytes.Equal(s.Body, bodies[i+1]) || s.Index != int64(i+1) {
			t.Fatalf("receipt %d in the log: index %d, %s", i, s.Index, s.Body)
		}
		if _, err := receipts.Verify(vkey, receipts.DefaultOrigin, s.Body, proofs[i], cp.Note); err != nil {
			t.Fatalf("receipt %d does not verify: %v", i, err)
		}
		if !pageVerifyInclusion(tlog.RecordHash(s.Body), proofs[i].Index, proofs[i].TreeSize, proofs[i].Hashes, cp.Root, nil) {
			t.Fatalf("receipt %d does not verify by the page's algorithm", i)
		}
	}
	answer := struct {
		ReceiptID     string                 `json:"receipt_id"`
		ActualMS      int64                  `json:"actual_ms"`
		ActualHours   string                 `json:"actual_hours"`
		ActualCostUSD string                 `json:"actual_cost_usd"`
		Receipts      []receipts.WireReceipt `json:"receipts"`
		Proofs        []receipts.Proof       `json:"proofs"`
		Checkpoint    string                 `json:"checkpoint"`
	}{rs[1].ID, rs[2].ActualMS, receipts.Hours(rs[2].ActualMS), receipts.FormatMicros(rs[2].CostMicros), nil, proofs, string(cp.Note)}
	for _, s := range ss {
		answer.Receipts = append(answer.Receipts, s.Wire())
	}
	var jb bytes.Buffer
	enc := json.NewEncoder(&jb)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(answer); err != nil {
		t.Fatal(err)
	}
	ex = append(ex, docExample{"complete-receipts", jb.String()})

	// The tree, hash by hash.
	leaves := make([]tlog.Hash, len(bodies))
	for i, b := range bodies {
		leaves[i] = tlog.RecordHash(b)
	}
	n01 := tlog.NodeHash(leaves[0], leaves[1])
	root := tlog.NodeHash(n01, leaves[2])
	if root != cp.Root || cp.Size != 3 {
		t.Fatalf("the page's tree gives root %x, the checkpoint has %x at size %d", root, cp.Root, cp.Size)
	}
	if want := sha256.Sum256(append(append([]byte{1}, leaves[0][:]...), leaves[1][:]...)); want != n01 {
		t.Fatal("tlog.NodeHash is not SHA-256(0x01 || left || right)")
	}
	var tree strings.Builder
	line := func(name, formula string, h tlog.Hash) {
		fmt.Fprintf(&tree, "%-9s = %-37s = %x\n", name, formula, h[:])
	}
	for i, l := range leaves {
		line(fmt.Sprintf("leaf[%d]", i), fmt.Sprintf("SHA-256(0x00 || receipt %d bytes)", i), l)
	}
	line("node[0,2)", "SHA-256(0x01 || leaf[0] || leaf[1])", n01)
	line("root", "SHA-256(0x01 || node[0,2) || leaf[2])", root)
	fmt.Fprintf(&tree, "root in base64 (the checkpoint's third line): %s\n", base64.StdEncoding.EncodeToString(root[:]))
	ex = append(ex, docExample{"tree", tree.String()})

	// proofs[0], checked step by step.
	var steps strings.Builder
	p := proofs[0]
	if !pageVerifyInclusion(leaves[1], p.Index, p.TreeSize, p.Hashes, cp.Root, &steps) {
		t.Fatal("the page's walk-through fails")
	}
	ex = append(ex, docExample{"inclusion-steps", steps.String()})

	// The checkpoint, its keys, and its signature taken apart.
	if !pageVerifyNote(t, cp.Note, vkey, receipts.DefaultOrigin) {
		t.Fatal("the checkpoint does not verify by the page's rules")
	}
	text := cp.Note[:bytes.LastIndex(cp.Note, []byte("\n\n"))+1]
	origin, tr, err := receipts.ParseCheckpoint(text)
	if err != nil || origin != receipts.DefaultOrigin || tr != cp.Tree() {
		t.Fatalf("ParseCheckpoint = %q, %v, %v", origin, tr, err)
	}
	ex = append(ex, docExample{"checkpoint", string(cp.Note)})
	vparts := strings.SplitN(vkey, "+", 3)
	kb, err := base64.StdEncoding.DecodeString(vparts[2])
	if err != nil || len(kb) != 33 || kb[0] != 1 {
		t.Fatalf("verifier key %s", vkey)
	}
	sigLine := strings.TrimSuffix(strings.SplitN(string(cp.Note), "\n\n", 2)[1], "\n")
	sigBytes, err := base64.StdEncoding.DecodeString(sigLine[strings.LastIndexByte(sigLine, ' ')+1:])
	if err != nil || len(sigBytes) != 68 {
		t.Fatalf("signature line %q", sigLine)
	}
	msg := receipts.FormatCheckpoint(receipts.DefaultOrigin, cp.Tree())
	ex = append(ex, docExample{"checkpoint-keys", fmt.Sprintf(`signer key (secret; this example's only):
  %s
receipt_public_key (the verifier key):
  %s
key name:            %s  (equals the origin)
key hash:            %s  = first 4 bytes of SHA-256(key name || 0x0a || 0x01 || public key)
Ed25519 public key:  %x
signed message:      the %d bytes of the three checkpoint lines, final LF included
signature line:      "— " + key name + " " + base64(key hash || 64-byte signature) + LF
signature (hex):     %x
`, skey, vkey, vparts[0], vparts[1], kb[1:], len(msg), sigBytes[4:])})

	return ex
}

func wrap(s string, n int) string {
	var b strings.Builder
	for len(s) > n {
		b.WriteString(s[:n] + "\n")
		s = s[n:]
	}
	b.WriteString(s)
	return b.String()
}

// pageVerifyInclusion is the inclusion proof check of RFC 9162 §2.1.3.2,
// as the page gives it. It writes its steps to trace when not nil.
func pageVerifyInclusion(leaf tlog.Hash, index, size int64, path []tlog.Hash, root tlog.Hash, trace *strings.Builder) bool {
	if index < 0 || index >= size {
		return false
	}
	say := func(format string, args ...any) {
		if trace != nil {
			fmt.Fprintf(trace, format, args...)
		}
	}
	fn, sn, r := index, size-1, leaf
	say("start: fn = %d, sn = %d, r = leaf[%d] = %.16x...\n", fn, sn, index, r[:])
	for i, p := range path {
		if sn == 0 {
			return false
		}
		if fn&1 == 1 || fn == sn {
			r = tlog.NodeHash(p, r)
			say("hashes[%d]: fn = %d is odd or equals sn: r = SHA-256(0x01 || hashes[%d] || r) = %.16x...\n", i, fn, i, r[:])
			for fn&1 == 0 && fn != 0 {
				fn, sn = fn>>1, sn>>1
			}
		} else {
			r = tlog.NodeHash(r, p)
			say("hashes[%d]: fn = %d is even, below sn = %d: r = SHA-256(0x01 || r || hashes[%d]) = %.16x...\n", i, fn, sn, i, r[:])
		}
		fn, sn = fn>>1, sn>>1
		say("           shift: fn = %d, sn = %d\n", fn, sn)
	}
	say("end: sn = %d and r equals the checkpoint's root: %v\n", sn, r == root)
	return sn == 0 && r == root
}

// pageVerifyConsistency is the consistency proof check of RFC 9162
// §2.1.4.2, as the page gives it, with the page's rule for the proofs
// the control plane answers empty (from size 0, and between equal sizes).
func pageVerifyConsistency(first, second int64, firstRoot, secondRoot tlog.Hash, path []tlog.Hash) bool {
	switch {
	case first > second:
		return false
	case first == second:
		return len(path) == 0 && firstRoot == secondRoot
	case first == 0:
		return len(path) == 0
	case len(path) == 0:
		return false
	}
	if first&(first-1) == 0 {
		path = append([]tlog.Hash{firstRoot}, path...)
	}
	fn, sn := first-1, second-1
	for fn&1 == 1 {
		fn, sn = fn>>1, sn>>1
	}
	fr, sr := path[0], path[0]
	for _, c := range path[1:] {
		if sn == 0 {
			return false
		}
		if fn&1 == 1 || fn == sn {
			fr, sr = tlog.NodeHash(c, fr), tlog.NodeHash(c, sr)
			for fn&1 == 0 && fn != 0 {
				fn, sn = fn>>1, sn>>1
			}
		} else {
			sr = tlog.NodeHash(sr, c)
		}
		fn, sn = fn>>1, sn>>1
	}
	return fr == firstRoot && sr == secondRoot && sn == 0
}

// pageVerifyNote checks a signed note by the page's rules alone.
func pageVerifyNote(t *testing.T, signed []byte, verifierKey, origin string) bool {
	t.Helper()
	name, hashHex, keyB64, ok := cut3(verifierKey)
	if !ok || name != origin {
		return false
	}
	kb, err := base64.StdEncoding.DecodeString(keyB64)
	if err != nil || len(kb) != 33 || kb[0] != 0x01 {
		return false
	}
	h := sha256.Sum256(append([]byte(name+"\n"), kb...))
	if fmt.Sprintf("%08x", h[:4]) != hashHex {
		return false
	}
	s := string(signed)
	i := strings.LastIndex(s, "\n\n")
	if i < 0 || !utf8.ValidString(s) {
		return false
	}
	text, sigs := s[:i+1], s[i+2:]
	lines := strings.Split(text, "\n")
	if len(lines) != 4 || lines[0] != origin {
		return false
	}
	found := false
	for _, line := range strings.Split(strings.TrimSuffix(sigs, "\n"), "\n") {
		rest, ok := strings.CutPrefix(line, "— ")
		if !ok {
			return false
		}
		n, b64, _ := strings.Cut(rest, " ")
		sig, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(sig) < 5 {
			return false
		}
		if n != name || !bytes.Equal(sig[:4], h[:4]) {
			continue // another signer's, a witness's say
		}
		if len(sig) != 68 || !ed25519.Verify(ed25519.PublicKey(kb[1:]), []byte(text), sig[4:]) {
			return false
		}
		found = true
	}
	return found
}

func cut3(s string) (a, b, c string, ok bool) {
	a, rest, ok1 := strings.Cut(s, "+")
	b, c, ok2 := strings.Cut(rest, "+")
	return a, b, c, ok1 && ok2
}

// TestProtocolMerkleProofs holds the page's RFC 9162 algorithms to
// golang.org/x/mod/sumdb/tlog, which the control plane uses, for every
// tree of up to 40 receipts.
func TestProtocolMerkleProofs(t *testing.T) {
	var stored []tlog.Hash
	reader := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	const max = 40
	roots := make([]tlog.Hash, max+1)
	empty := sha256.Sum256(nil)
	roots[0] = empty
	if r, _ := tlog.TreeHash(0, reader); r != empty {
		t.Fatal("the empty tree's root is not SHA-256 of nothing")
	}
	var leaves []tlog.Hash
	for n := int64(0); n < max; n++ {
		body := []byte(fmt.Sprintf(`{"n":%d}`, n))
		hs, err := tlog.StoredHashes(n, body, reader)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, hs...)
		leaves = append(leaves, tlog.RecordHash(body))
		if roots[n+1], err = tlog.TreeHash(n+1, reader); err != nil {
			t.Fatal(err)
		}
	}
	for size := int64(1); size <= max; size++ {
		for i := int64(0); i < size; i++ {
			p, err := tlog.ProveRecord(size, i, reader)
			if err != nil {
				t.Fatal(err)
			}
			if !pageVerifyInclusion(leaves[i], i, size, p, roots[size], nil) {
				t.Fatalf("inclusion of %d in %d fails by the page's algorithm", i, size)
			}
			if len(p) > 0 {
				bad := slices.Clone(p)
				bad[0][0] ^= 1
				if pageVerifyInclusion(leaves[i], i, size, bad, roots[size], nil) {
					t.Fatalf("a changed proof of %d in %d passes", i, size)
				}
			}
			if size > 1 && pageVerifyInclusion(leaves[i], i, size, p, roots[size-1], nil) {
				t.Fatalf("a proof of %d in %d passes against the root of %d", i, size, size-1)
			}
		}
		for old := int64(0); old <= size; old++ {
			var p []tlog.Hash
			if old > 0 && old < size {
				var err error
				if p, err = tlog.ProveTree(size, old, reader); err != nil {
					t.Fatal(err)
				}
			}
			if !pageVerifyConsistency(old, size, roots[old], roots[size], p) {
				t.Fatalf("consistency of %d with %d fails by the page's algorithm", old, size)
			}
			if old > 0 && old < size && pageVerifyConsistency(old, size, roots[old], roots[size-1], p) {
				t.Fatalf("consistency of %d with %d passes against another root", old, size)
			}
		}
	}
}

// TestProtocolIDsAndKeyName checks that the example key is named after the origin,
// and ids have the layout the page describes.
func TestProtocolIDsAndKeyName(t *testing.T) {
	_, vkey := exampleLogKey(t)
	v, err := note.NewVerifier(vkey)
	if err != nil || v.Name() != receipts.DefaultOrigin {
		t.Fatalf("example key name %v, %v", v, err)
	}
	// The id layout the page describes.
	id := exampleID("rcp_", exampleFinished, "c7e2a19f0b4d3e8a5f16")
	ms, _ := strconv.ParseUint(id[4:16], 16, 64)
	if len(id) != 36 || int64(ms) != exampleFinished.UnixMilli() {
		t.Fatalf("id %s", id)
	}
}
