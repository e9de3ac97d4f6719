// Package client is the Go worker side of the nodelane protocol: a Client
// that signs every request (RFC 9421, Ed25519) with a node Identity and
// retries what is safe to retry, and a Runner that registers, heartbeats,
// leases jobs for its handlers, reports their logs, artifacts and results,
// renews its worker token with its key (Client.RenewToken: the
// provisioning token is needed only for the first registration), and
// drains on shutdown. Client.UploadArtifact sends an artifact's bytes to
// the control plane's store, in parts streamed from a file, and
// Client.DownloadArtifact reads a stored checkpoint back for a resumed
// attempt (Reporter.UploadArtifact and Reporter.DownloadCheckpoint in a
// handler).
//
// A worker binary links this package, package wire and the replay and
// receipts cores only: no lease state machine, credential store, envelope
// or database driver.
package client
