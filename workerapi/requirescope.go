package workerapi

import (
	"net/http"

	"github.com/nodelane/nodelane/credential"
)

// RequireScope wraps h, a handler of the host's own (cmd/server's GET
// /metrics), so that it serves only a request whose bearer credential
// carries scope. Any other request is answered as an operator route
// answers it, with PROTOCOL.md's error body, before h runs: 401
// missing_credential, invalid_token, token_expired or token_revoked,
// 403 worker_banned or insufficient_scope.
func (s *Server) RequireScope(scope credential.Scope, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := credential.BearerToken(r.Header)
		if err == nil {
			_, _, err = s.verify(r.Context(), token, scope)
		}
		if err != nil {
			s.fail(w, r, requestID(r, s.cfg.Rand), err)
			return
		}
		h.ServeHTTP(w, r)
	})
}
