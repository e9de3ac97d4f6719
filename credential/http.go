package credential

import (
	"fmt"
	"net/http"
	"strings"
)

// BearerToken returns the token of the request's "Authorization: Bearer"
// header. It returns ErrMissingCredential when there is no Authorization
// header, when its scheme is not Bearer (Basic, say), or when the token is
// empty, and ErrInvalidToken when the header appears more than once, so
// that no two parties can disagree on which credential a request carried.
// The scheme is matched without regard to case (RFC 9110 §11.1); the token
// is returned as sent, for Issuer.Verify to check.
func BearerToken(h http.Header) (string, error) {
	vs := h.Values("Authorization")
	switch {
	case len(vs) == 0:
		return "", ErrMissingCredential
	case len(vs) > 1:
		return "", fmt.Errorf("%w: %d Authorization headers", ErrInvalidToken, len(vs))
	}
	scheme, token, _ := strings.Cut(strings.TrimLeft(vs[0], " \t"), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("%w: Authorization scheme is not Bearer", ErrMissingCredential)
	}
	token = strings.Trim(token, " \t")
	if token == "" {
		return "", fmt.Errorf("%w: empty Bearer token", ErrMissingCredential)
	}
	return token, nil
}
