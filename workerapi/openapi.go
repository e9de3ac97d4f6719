package workerapi

import (
	"context"
	_ "embed"
	"encoding/json"
	"net/http"
)

// openAPIDocument is the OpenAPI 3.1 description of every worker and
// operator route, relative to the mount point. It is written by hand
// beside PROTOCOL.md; openapi_test.go holds it to the route tables and to
// the wire types, so it cannot drift from what the handlers serve, and
// cmd/openapi_test.go (in the programs' module, with kin-openapi)
// validates it as OpenAPI 3.1.
//
//go:embed openapi.json
var openAPIDocument []byte

// openAPI serves the document. It is a public route: no credential, no
// signature. The document passes through writeJSON as a json.RawMessage,
// which only compacts it.
func (s *Server) openAPI(context.Context, *call) (int, any, error) {
	return http.StatusOK, json.RawMessage(openAPIDocument), nil
}
