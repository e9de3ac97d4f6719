// Package replay signs and verifies nodelane worker requests (RFC 9421
// HTTP Message Signatures, RFC 9530 digests, and the profile of
// PROTOCOL.md, section 4 "Request signing") and makes each signature
// single use.
//
// It has two layers. The generic one is RFC 9421 (HTTP Message
// Signatures) with Ed25519 and RFC 9530 (Content-Digest): [SignatureBase]
// builds the signature base of a request for any list of covered
// components, [SignRequest] and [VerifyRequest] sign and check it,
// [ParseSignature] reads one labelled signature from the Signature-Input
// and Signature fields, and [ContentDigest] and [CheckContentDigest]
// compute and check a body digest. It reproduces the Ed25519 example of
// RFC 9421 Appendix B.2.6.
//
// The nodelane profile sits on top. Every worker request carries one
// signature labelled "nodelane" that covers, in this order,
//
//	"@method" "@authority" "@path" "@query" "content-digest" "content-type"
//
// with the parameters created, expires, nonce, keyid and tag (no others,
// and no alg: the algorithm comes from the key record). @path and @query
// are the request-target as the client sent it (r.RequestURI on the
// server), so a handler mounted under a prefix, or behind
// http.StripPrefix, still verifies. A [Signer] signs requests for a
// worker; a [Verifier] checks them on the server in a fixed order
// (presence, syntax and profile, digest, key id, signature, time window)
// and then consumes the nonce in a [Store], so that no request runs
// twice. Each failure is one of the package's sentinel errors, which
// match the error codes of PROTOCOL.md one to one.
//
// Structured fields are parsed with github.com/dunglas/httpsfv. Since a
// parser keeps only the last of two members or parameters with the same
// name, duplicates are first looked for in the raw field, and a request
// that has any is malformed.
//
// A Store keeps each (node, nonce) until the signature expires;
// [MemoryStore] keeps them in memory, a SQL adapter (bunstore) in the
// database the replicas share, and package replaytest is the conformance
// suite every Store passes.
package replay
