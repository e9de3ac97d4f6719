package bunstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/replay"
)

// secretTables are the tables the credential, nonce and fingerprint
// stores write.
var secretTables = []string{"nodelane_principals", "nodelane_credentials", "nodelane_nonces", "nodelane_secret_fingerprints"}

// TestNoSecretsInRowsOrLogs runs a credential and request-signing workload
// with every log line captured (the default slog logger, and a bun query
// hook that logs each statement with its arguments, as a host's query
// logger would), then looks for every token, token body and secret of
// the workload, in every encoding, in every column of every row the
// stores wrote and in all the log text. Negative controls plant one in a
// row or in the log and check that the scanner finds it.
func TestNoSecretsInRowsOrLogs(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			ctx := context.Background()
			tdb := d.New(t)
			raw := tdb.Bun(t)

			logs := &syncbuf.Buffer{}
			logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			prev := slog.Default()
			slog.SetDefault(logger) // also captures the log package
			t.Cleanup(func() { slog.SetDefault(prev) })

			// The stores run on a host-opened handle that logs every query.
			db, err := bunstore.New(tdb.Bun(t).WithQueryHook(queryLogger{logger}), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Migrate(ctx); err != nil {
				t.Fatal(err)
			}

			w := runSecretWorkload(t, ctx, db, logger)
			if len(w.tokens) < 6 || w.verified < 10 || w.signed < 10 {
				t.Fatalf("workload too small: %d tokens, %d verifications, %d signed requests", len(w.tokens), w.verified, w.signed)
			}
			ns := secretNeedles(t, w.tokens, w.secrets)

			// The clean scan: every table has rows, none holds a secret.
			hay, counts := scanTables(t, ctx, raw)
			for _, table := range secretTables {
				if counts[table] == 0 {
					t.Errorf("%s has no rows: the scan would prove nothing", table)
				}
			}
			if logs.Len() == 0 {
				t.Error("nothing was logged: the query hook did not run")
			}
			hay = append(hay, haystack{"log", logs.String()})
			if found := findSecrets(hay, ns); len(found) > 0 {
				t.Errorf("secrets found:\n%s", strings.Join(found, "\n"))
			}
			t.Logf("scanned %v rows and %d bytes of log for %d tokens and %d secrets (%d needles)",
				counts, logs.Len(), len(w.tokens), len(w.secrets), len(ns))

			// Negative controls: each plants one secret, in a transaction
			// that is rolled back, and the scanner must find it.
			tok := w.tokens[0]
			_, secret := splitToken(t, tok)
			controls := []struct {
				name  string
				plant string // an UPDATE or INSERT, with args
				args  []any
				log   string // or a line appended to the log
				want  string // a finding must contain this
			}{
				{name: "token in a principal's name", plant: "UPDATE nodelane_principals SET name = ? WHERE id = ?",
					args: []any{"minted " + tok, w.node.id}, want: "nodelane_principals: the token"},
				{name: "token body in rotated_to", plant: "UPDATE nodelane_credentials SET rotated_to = ?",
					args: []any{strings.TrimPrefix(tok, credential.TokenPrefix)}, want: "nodelane_credentials: the token body"},
				{name: "secret bytes as a public key", plant: "UPDATE nodelane_principals SET public_key = ? WHERE id = ?",
					args: []any{secret, w.node.id}, want: "nodelane_principals: the secret's hex"},
				{name: "secret as a digest", plant: "UPDATE nodelane_credentials SET digest = ?",
					args: []any{secret}, want: "nodelane_credentials: the secret's base64"},
				{name: "secret base62 as a nonce", plant: "INSERT INTO nodelane_nonces (node_id, nonce, expires_at) VALUES (?, ?, ?)",
					args: []any{w.node.id, base62(secret, 43), int64(1)}, want: "nodelane_nonces: the secret's base62"},
				{name: "secret base64url in a ban reason", plant: "UPDATE nodelane_principals SET ban_reason = ?",
					args: []any{base64.RawURLEncoding.EncodeToString(secret)}, want: "nodelane_principals: the secret's base64url"},
				{name: "token hex in scopes", plant: "UPDATE nodelane_credentials SET scopes = ?",
					args: []any{hex.EncodeToString([]byte(tok))}, want: "nodelane_credentials: the token's hex"},
				{name: "unknown token-shaped string", plant: "UPDATE nodelane_principals SET name = ?",
					args: []any{credential.TokenPrefix + strings.Repeat("Ab1", 23) + "zz"}, want: "nodelane_principals: a token-shaped string"},
				{name: "pepper hex as a fingerprint", plant: "UPDATE nodelane_secret_fingerprints SET fingerprint = ?",
					args: []any{hex.EncodeToString(w.pepper)}, want: "nodelane_secret_fingerprints: the pepper's hex"},
				{name: "token in the log", log: fmt.Sprintf("level=INFO msg=\"bearer rejected\" token=%s\n", tok), want: "log: the token"},
				{name: "pepper in the log", log: "pepper=" + hex.EncodeToString(w.pepper) + "\n", want: "log: the pepper's hex"},
				{name: "node key in the log", log: "key=" + base64.StdEncoding.EncodeToString(w.node.priv.Seed()) + "\n", want: "log: the node private key's base64"},
			}
			for _, c := range controls {
				t.Run("control/"+c.name, func(t *testing.T) {
					var found []string
					if c.plant != "" {
						tx, err := raw.BeginTx(ctx, nil)
						if err != nil {
							t.Fatal(err)
						}
						defer tx.Rollback()
						if _, err := tx.ExecContext(ctx, c.plant, c.args...); err != nil {
							t.Fatalf("plant: %v", err)
						}
						h, _ := scanTables(t, ctx, tx)
						found = findSecrets(append(h, haystack{"log", logs.String()}), ns)
					} else {
						found = findSecrets(append(slices.Clone(hay), haystack{"log", logs.String() + c.log}), ns)
					}
					if !slices.ContainsFunc(found, func(f string) bool { return strings.Contains(f, c.want) }) {
						t.Fatalf("the scanner missed a planted secret: want a finding with %q, got %q", c.want, found)
					}
				})
			}
		})
	}
}

// secretWorkload is what runSecretWorkload made: every token it minted,
// every secret it held, and the node it signed as.
type secretWorkload struct {
	tokens   []string
	secrets  map[string][]byte // name -> secret bytes
	pepper   []byte
	node     *node
	verified int // credential verifications attempted
	signed   int // signed requests verified
}

// runSecretWorkload mints, verifies, rotates and revokes credentials, bans
// and unbans, and signs and verifies requests (replays included) on db,
// logging every outcome, errors included, as a host would.
func runSecretWorkload(t *testing.T, ctx context.Context, db *bunstore.DB, logger *slog.Logger) *secretWorkload {
	t.Helper()
	is, pepper := newIssuer(t, db)
	v := replay.NewVerifier(db.NonceStore(nil), nil)
	n := newNode(t, "studio-gpu-1")
	w := &secretWorkload{secrets: map[string][]byte{}, pepper: pepper, node: n}
	w.secrets["pepper"] = pepper
	// The pepper's fingerprint, as every replica stores it at startup.
	if _, err := fingerprint.Check(ctx, db.FingerprintStore(), []fingerprint.Fingerprint{fingerprint.Pepper(1, pepper)}); err != nil {
		t.Fatal(err)
	}
	w.secrets["node private key"] = n.priv.Seed()
	w.secrets["node private key (64 bytes)"] = n.priv

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	keep := func(tok string) {
		w.tokens = append(w.tokens, tok)
		_, secret := splitToken(t, tok)
		w.secrets[fmt.Sprintf("secret of token %d", len(w.tokens))] = secret
	}
	verify := func(tok string, scope credential.Scope) error {
		w.verified++
		p, c, err := is.Verify(ctx, tok, scope)
		if err != nil {
			logger.InfoContext(ctx, "credential refused", "scope", scope, "err", err)
			return err
		}
		logger.InfoContext(ctx, "credential verified", "principal", p, "credential", c)
		return nil
	}

	node, err := is.CreatePrincipal(ctx, credential.Principal{ID: n.id, Kind: credential.KindNode, Name: "studio"})
	must(err)
	_, err = is.SetNodeKey(ctx, node.ID, n.pub)
	must(err)
	op, err := is.CreatePrincipal(ctx, credential.Principal{Kind: credential.KindOperator, Name: "ops"})
	must(err)
	logger.InfoContext(ctx, "principals", "node", node, "operator", op)

	var nodeCreds []*credential.Credential
	for range 3 {
		tok, c, err := is.Mint(ctx, node.ID, []credential.Scope{credential.ScopeNodeHeartbeat, credential.ScopeNodePoll}, time.Hour)
		must(err)
		keep(tok)
		nodeCreds = append(nodeCreds, c)
		logger.InfoContext(ctx, "minted", "credential", c)
		must(verify(tok, credential.ScopeNodePoll))
		if err := verify(tok, credential.ScopeOperatorJobs); err == nil {
			t.Fatal("a node credential verified for an operator scope")
		}
	}
	opTok, opCred, err := is.Mint(ctx, op.ID, []credential.Scope{credential.ScopeOperatorCredentials}, 0)
	must(err)
	keep(opTok)
	must(verify(opTok, credential.ScopeOperatorCredentials))

	// Rotation with grace: both verify; the old one stops after revocation.
	newTok, nc, err := is.Rotate(ctx, nodeCreds[0].ID, time.Minute)
	must(err)
	keep(newTok)
	logger.InfoContext(ctx, "rotated", "from", nodeCreds[0].ID, "to", nc)
	must(verify(w.tokens[0], credential.ScopeNodePoll))
	must(verify(newTok, credential.ScopeNodePoll))
	opNew, _, err := is.Rotate(ctx, opCred.ID, 0)
	must(err)
	keep(opNew)
	must(verify(opNew, credential.ScopeOperatorCredentials))
	if err := verify(opTok, credential.ScopeOperatorCredentials); err == nil {
		t.Fatal("a token rotated without grace still verifies")
	}
	_, err = is.Revoke(ctx, nodeCreds[1].ID)
	must(err)
	if err := verify(w.tokens[1], credential.ScopeNodePoll); err == nil {
		t.Fatal("a revoked token verifies")
	}
	// A wrong secret, an unknown id, a malformed token.
	id, secret := splitToken(t, w.tokens[2])
	secret[0] ^= 1
	forged := joinToken(id, secret)
	if err := verify(forged, credential.ScopeNodePoll); err == nil {
		t.Fatal("a forged token verifies")
	}
	w.tokens = append(w.tokens, forged)
	w.secrets["forged secret"] = secret
	if err := verify(w.tokens[2][:20], credential.ScopeNodePoll); err == nil {
		t.Fatal("a truncated token verifies")
	}
	_, err = is.Ban(ctx, node.ID, "audit")
	must(err)
	if err := verify(w.tokens[2], credential.ScopeNodePoll); err == nil {
		t.Fatal("a banned node's token verifies")
	}
	_, err = is.Unban(ctx, node.ID)
	must(err)
	must(verify(w.tokens[2], credential.ScopeNodePoll))

	// Signed requests: each authenticated with a node credential and its
	// signature in one transaction, as a request is; one replayed, one
	// whose transaction fails.
	for i := range 12 {
		wire := n.request(t)
		err := db.InTx(ctx, func(ctx context.Context) error {
			if _, _, err := is.Verify(ctx, w.tokens[2], credential.ScopeNodeHeartbeat); err != nil {
				return err
			}
			if err := verifyWire(ctx, v, n, wire); err != nil {
				return err
			}
			if i == 5 {
				return errRollbackNonce
			}
			return nil
		})
		w.signed++
		logger.InfoContext(ctx, "signed request", "i", i, "err", err, "request", string(wire))
		if i != 5 {
			must(err)
		}
		if i%4 == 0 {
			err := verifyWire(ctx, v, n, wire)
			logger.InfoContext(ctx, "replayed request", "err", err)
			if i != 5 && err == nil {
				t.Fatal("a replay was admitted")
			}
		}
	}
	if _, err := v.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// queryLogger is a bun query hook that logs every statement, as run,
// with its arguments and error.
type queryLogger struct{ log *slog.Logger }

func (queryLogger) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context { return ctx }

func (h queryLogger) AfterQuery(ctx context.Context, e *bun.QueryEvent) {
	h.log.DebugContext(ctx, "query", "op", e.Operation(), "query", e.Query, "args", fmt.Sprint(e.QueryArgs), "err", e.Err)
}

// haystack is text to search, and where it came from.
type haystack struct{ where, text string }

// scanTables reads every row of the secret tables with SELECT * into
// generic maps and renders every column as text, as hex and as base64
// (of its bytes, for a BLOB; of its text, otherwise). It returns the
// renderings and the row count of each table.
func scanTables(t *testing.T, ctx context.Context, idb bun.IDB) ([]haystack, map[string]int) {
	t.Helper()
	var out []haystack
	counts := map[string]int{}
	for _, table := range secretTables {
		var rows []map[string]any
		if err := idb.NewSelect().TableExpr(table).ColumnExpr("*").Scan(ctx, &rows); err != nil {
			t.Fatalf("select * from %s: %v", table, err)
		}
		counts[table] = len(rows)
		var b strings.Builder
		for i, row := range rows {
			for col, v := range row {
				var raw []byte
				switch v := v.(type) {
				case []byte:
					raw = v
				case string:
					raw = []byte(v)
				default:
					raw = []byte(fmt.Sprint(v))
				}
				fmt.Fprintf(&b, "%d.%s text=%s\n", i, col, raw)
				fmt.Fprintf(&b, "%d.%s hex=%x\n", i, col, raw)
				fmt.Fprintf(&b, "%d.%s base64=%s\n", i, col, base64.StdEncoding.EncodeToString(raw))
			}
		}
		out = append(out, haystack{table, b.String()})
	}
	return out, counts
}

type needle struct{ name, text string }

// secretNeedles lists every form of the tokens and secrets the scanner
// looks for.
func secretNeedles(t *testing.T, tokens []string, secrets map[string][]byte) []needle {
	t.Helper()
	var ns []needle
	for _, tok := range tokens {
		body := strings.TrimPrefix(tok, credential.TokenPrefix)
		ns = append(ns,
			needle{"the token", tok},
			needle{"the token body", body},
			needle{"the token body without its checksum", body[:65]},
			needle{"the token's hex", hex.EncodeToString([]byte(tok))},
			needle{"the token's base64", base64.StdEncoding.EncodeToString([]byte(tok))},
			needle{"the token's base64url", base64.RawURLEncoding.EncodeToString([]byte(tok))},
		)
		id, secret := splitToken(t, tok)
		ns = append(ns, bytesNeedles("the token's id and secret", append(id, secret...))...)
		for _, h := range [][32]byte{sha256.Sum256(secret), sha256.Sum256([]byte(tok))} {
			ns = append(ns, bytesNeedles("an unkeyed SHA-256 of the token or secret", h[:])...)
		}
	}
	for name, s := range secrets {
		if strings.HasPrefix(name, "secret of token") || name == "forged secret" {
			name = "secret"
		}
		ns = append(ns, bytesNeedles("the "+name, s)...)
	}
	return ns
}

// bytesNeedles lists b raw and in hex, base64 and base62.
func bytesNeedles(name string, b []byte) []needle {
	v := new(big.Int).SetBytes(b)
	return []needle{
		{name + "'s bytes", string(b)},
		{name + "'s hex", hex.EncodeToString(b)},
		{name + "'s HEX", strings.ToUpper(hex.EncodeToString(b))},
		{name + "'s base64", base64.StdEncoding.EncodeToString(b)},
		{name + "'s base64", base64.RawStdEncoding.EncodeToString(b)},
		{name + "'s base64url", base64.URLEncoding.EncodeToString(b)},
		{name + "'s base64url", base64.RawURLEncoding.EncodeToString(b)},
		// Unpadded, so that a zero-padded spelling contains it.
		{name + "'s base62", base62(b, 0)},
		{name + "'s base62", v.Text(62)}, // math/big's alphabet: lower case first
		{name + "'s decimal bytes", strings.Trim(fmt.Sprint(b), "[]")},
	}
}

// findSecrets returns a line for each needle, or token-shaped string,
// found in a haystack.
func findSecrets(hay []haystack, ns []needle) []string {
	var found []string
	for _, h := range hay {
		for _, n := range ns {
			if strings.Contains(h.text, n.text) {
				found = append(found, h.where+": "+n.name)
			}
		}
		for _, m := range credential.TokenPattern.FindAllString(h.text, -1) {
			found = append(found, fmt.Sprintf("%s: a token-shaped string (%d characters)", h.where, len(m)))
		}
	}
	slices.Sort(found)
	return slices.Compact(found)
}

const base62Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// base62 writes b as a big-endian number in the token alphabet, in n
// digits (zero-padded), or in as few as it needs if n is 0.
func base62(b []byte, n int) string {
	v := new(big.Int).SetBytes(b)
	var out []byte
	r, base := new(big.Int), big.NewInt(62)
	for v.Sign() > 0 || len(out) < n {
		v.QuoRem(v, base, r)
		out = append(out, base62Alphabet[r.Int64()])
	}
	slices.Reverse(out)
	return string(out)
}

// splitToken decodes a token independently of package credential and
// returns its 16-byte id and 32-byte secret.
func splitToken(t *testing.T, tok string) (id, secret []byte) {
	t.Helper()
	body, ok := strings.CutPrefix(tok, credential.TokenPrefix)
	if !ok || len(body) != 71 {
		t.Fatalf("%d-byte string is not a token", len(tok))
	}
	v := new(big.Int)
	for i := range 65 {
		d := strings.IndexByte(base62Alphabet, body[i])
		if d < 0 {
			t.Fatalf("token body is not base62")
		}
		v.Mul(v, big.NewInt(62)).Add(v, big.NewInt(int64(d)))
	}
	raw := v.FillBytes(make([]byte, 48))
	return raw[:16], raw[16:]
}

// joinToken is the inverse of splitToken, with a valid checksum.
func joinToken(id, secret []byte) string {
	head := credential.TokenPrefix + base62(append(slices.Clone(id), secret...), 65)
	sum := crc32.ChecksumIEEE([]byte(head))
	return head + base62(big.NewInt(int64(sum)).Bytes(), 6)
}
