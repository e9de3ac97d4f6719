// Package credential keeps the principals of nodelane (nodes and
// operators), their scoped bearer credentials, node public keys and bans
// (PROTOCOL.md, section 2 "Credentials and tokens").
//
// # Tokens
//
// A credential token is shown once, when it is minted or rotated:
//
//	nlc_ <65 base62 digits: 16-byte id || 32-byte secret> <6 base62 digits: CRC32>
//
// The checksum (CRC32-IEEE over everything before it, prefix included)
// lets Verify reject mistyped, truncated or made-up tokens before it
// consults a store, and lets secret scanners ([TokenPattern]) tell a real
// token from a look-alike. The store keeps the id, and of the secret only
// its HMAC-SHA256 under a key derived from a server-side pepper, so a
// leaked database does not yield usable tokens.
//
// # Verification
//
// [Issuer.Verify] checks, in order, and the first failure answers:
// shape and checksum ([ErrInvalidToken], no store call); the id and the
// secret ([ErrInvalidToken] for both, after the same work, so an unknown
// id cannot be told from a wrong secret); expiry ([ErrExpired]);
// revocation ([ErrRevoked]); a limit of uses that is spent
// ([ErrExhausted]); a ban of the principal ([ErrBanned]); the
// scope ([ErrInsufficientScope]). Scopes match exactly: there are no
// wildcards, prefixes or case folding. A store that fails makes Verify
// fail with the store's error wrapped, never pass.
//
// # Delegation
//
// A credential that may mint credentials (operator:credentials on the
// operator routes) mints only scopes it holds itself: [Issuer.MintAs]
// refuses any other with a [*ScopeError] that names them and matches
// [ErrInsufficientScope], so no credential makes one more powerful than
// itself. [Issuer.Mint] checks no minter: it is for code with authority
// of its own, such as a bootstrap. [Issuer.ListCredentials] pages the
// credentials in byte order of their ids.
//
// # Limits, quotas, bans by key, renewal
//
// A credential may be limited in uses ([MintOptions].MaxUses, through
// [Issuer.MintWith]): [Issuer.Use], called in the transaction of what the
// use stands for (a registration, for a provisioning credential), counts
// one with a conditional update (every credential's uses are counted, so
// [Credential].Uses tells how many nodes a provisioning credential
// registered), so concurrent uses never exceed the limit, and a spent
// credential no longer verifies. [Issuer.Charge] counts what a principal
// writes against a quota per window of time (a node's audit receipts per
// hour), with one conditional write in the store, and refuses what does
// not fit with a [*QuotaError] that says when the window ends. A ban follows a
// node's key: [Issuer.KeyBan] finds a banned principal that holds a key,
// so that a caller can refuse the key under any principal id.
// [Issuer.Renew] replaces a credential with a new one while the old one
// lives on for a short grace, and may be repeated within that grace.
//
// # Peppers
//
// Config.Peppers maps versions to peppers; new credentials use
// Config.PepperVersion and record it, so a pepper can be rotated by adding
// a new version and keeping the old one configured until the credentials
// minted under it have expired or been rotated.
//
// The Issuer holds the logic; a Store (MemoryStore here, bunstore for
// SQLite and PostgreSQL) keeps the records and passes the conformance
// suite in package credentialtest.
package credential
