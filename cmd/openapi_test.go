package cmd

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// The OpenAPI document of the worker and operator routes,
// workerapi/openapi.json, is validated here, in the programs' module, so
// that kin-openapi stays out of the library's module graph. workerapi's
// own tests hold the document to the routes, the scopes and the wire
// types, and the handlers' answers to its schemas (openapi_test.go,
// FuzzHandler); they read it as plain JSON.

// openAPIPath is the document beside the workerapi package that embeds
// and serves it (workerapi's TestOpenAPIServed checks that it serves
// exactly this file).
var openAPIPath = filepath.Join("..", "workerapi", "openapi.json")

// loadOpenAPIDoc loads workerapi/openapi.json with kin-openapi, which
// resolves every reference in it.
func loadOpenAPIDoc(t testing.TB) *openapi3.T {
	t.Helper()
	b, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil {
		t.Fatalf("loading %s: %v", openAPIPath, err)
	}
	return doc
}

// TestOpenAPIValidates checks that workerapi/openapi.json is an OpenAPI
// 3.1 document that validates, formats, patterns, defaults and examples
// included.
func TestOpenAPIValidates(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi.json is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	err := doc.Validate(t.Context(),
		openapi3.EnableSchemaFormatValidation(),
		openapi3.EnableSchemaPatternValidation(),
		openapi3.EnableSchemaDefaultsValidation(),
		openapi3.EnableExamplesValidation(),
	)
	if err != nil {
		t.Fatalf("openapi.json does not validate: %v", err)
	}
}

// TestOpenAPILint checks what the validator does not: required names
// exist, operation ids are unique, and every error response is one of
// components/responses.
func TestOpenAPILint(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	for name, ref := range doc.Components.Schemas {
		s := ref.Value
		for _, r := range s.Required {
			if _, ok := s.Properties[r]; !ok {
				t.Errorf("schema %s requires %q, which it does not define", name, r)
			}
		}
		if len(s.Properties) > 0 && !s.Type.Is("object") {
			t.Errorf("schema %s has properties but type %v", name, s.Type)
		}
	}
	ids := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			if op.OperationID == "" {
				t.Errorf("%s has no operationId", where)
			} else if prev, ok := ids[op.OperationID]; ok {
				t.Errorf("%s and %s share operationId %s", prev, where, op.OperationID)
			}
			ids[op.OperationID] = where
			for code, resp := range op.Responses.Map() {
				n, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s: response %q is not a status code", where, code)
					continue
				}
				if n >= 400 && !strings.HasPrefix(resp.Ref, "#/components/responses/") {
					t.Errorf("%s: error response %s is not a components/responses reference", where, code)
				}
			}
		}
	}
	if len(ids) == 0 {
		t.Fatal("openapi.json has no operations: the lint checked nothing")
	}
}
