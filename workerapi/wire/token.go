package wire

import "time"

// PathToken is the route a registered node renews its worker token on,
// signed by its key: no provisioning token is needed after the first
// registration.
const PathToken = "/workers/token"

// Limits of provisioning and token renewal.
const (
	// TokenRenewalGraceSeconds is how long the worker token a renewal
	// replaces keeps working after it, for requests already under way.
	TokenRenewalGraceSeconds = 60
	// MaxRegistrations is the largest max_registrations of a credential
	// minted on POST /operator/credentials.
	MaxRegistrations = 1_000_000
)

// RenewTokenRequest is the body of POST /workers/token: {}. The token to
// renew is the request's bearer token, and the node's signature proves
// the key.
type RenewTokenRequest struct{}

// RenewTokenResponse answers POST /workers/token.
type RenewTokenResponse struct {
	WorkerID string `json:"worker_id"`
	// WorkerToken replaces the bearer token of the request, which keeps
	// working until PreviousTokenExpiresAt (at most
	// TokenRenewalGraceSeconds from now) and then stops.
	WorkerToken            string    `json:"worker_token"`
	TokenExpiresAt         time.Time `json:"token_expires_at"`
	PreviousTokenExpiresAt time.Time `json:"previous_token_expires_at"`
	ServerTime             time.Time `json:"server_time"`
}
