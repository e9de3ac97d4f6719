package workerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The OpenAPI document is held to the code three ways: it validates as
// OpenAPI 3.1 (kin-openapi), its operations are exactly the routes the
// handlers serve with their scopes, and its schemas have exactly the
// fields of the wire types. Answers of the running handlers are checked
// against it too (openAPIChecker), here and by FuzzHandler.

func loadOpenAPIDoc(t testing.TB) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openAPIDocument)
	if err != nil {
		t.Fatalf("loading openapi.json: %v", err)
	}
	return doc
}

func TestOpenAPIValidates(t *testing.T) {
	doc := loadOpenAPIDoc(t)
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi.json is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	err := doc.Validate(context.Background(),
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
}

// TestOpenAPIEnums holds the document's enums to the code's lists.
func TestOpenAPIEnums(t *testing.T) {
	doc := loadOpenAPIDoc(t)
	enum := func(schema, prop string) []string {
		t.Helper()
		s := doc.Components.Schemas[schema].Value
		if prop != "" {
			s = s.Properties[prop].Value
		}
		var out []string
		for _, v := range s.Enum {
			out = append(out, v.(string))
		}
		sort.Strings(out)
		return out
	}
	var codes []string
	seen := map[string]bool{}
	for _, e := range errorTable {
		if !seen[e.st.code] {
			seen[e.st.code] = true
			codes = append(codes, e.st.code)
		}
	}
	sort.Strings(codes)
	var kinds, scopes, states []string
	for _, k := range receipts.Kinds() {
		kinds = append(kinds, string(k))
	}
	for _, s := range credential.AllScopes() {
		scopes = append(scopes, string(s))
	}
	sort.Strings(scopes)
	for _, s := range []lease.State{lease.StateQueued, lease.StateLeased, lease.StateRunning, lease.StateSucceeded, lease.StateFailed, lease.StateCanceled} {
		states = append(states, string(s))
	}
	sort.Strings(states)
	for _, c := range []struct {
		name       string
		got, want  []string
		schemaPath string
	}{
		{"error codes", enum("ErrorDetail", "code"), codes, "ErrorDetail.code"},
		{"receipt kinds", enum("Receipt", "kind"), kinds, "Receipt.kind"},
		{"scopes", enum("Scope", ""), scopes, "Scope"},
		{"job states", enum("JobState", ""), states, "JobState"},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %s is %v, the code has %v", c.name, c.schemaPath, c.got, c.want)
		}
	}
	// Every error response's codes are codes of its status.
	byCode := oasErrorStatuses()
	for name, ref := range doc.Components.Responses {
		s := ref.Value.Content.Get("application/json").Schema.Value
		if len(s.AllOf) != 2 {
			t.Errorf("response %s: want allOf [Error, code enum]", name)
			continue
		}
		var status int
		for _, v := range s.AllOf[1].Value.Properties["error"].Value.Properties["code"].Value.Enum {
			st, ok := byCode[v.(string)]
			if !ok {
				t.Errorf("response %s: unknown code %v", name, v)
			} else if status != 0 && st != status {
				t.Errorf("response %s mixes statuses %d and %d", name, status, st)
			}
			status = st
		}
	}
}

// oasErrorStatuses maps each error code to its HTTP status.
func oasErrorStatuses() map[string]int {
	m := map[string]int{}
	for _, e := range errorTable {
		m[e.st.code] = e.st.http
	}
	return m
}

// TestOpenAPIRoutes checks that every route the handlers serve is an operation of the
// document, with its scope and its signature headers, and every operation
// is a route.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPIDoc(t)
	s := &Server{}
	served := map[string]route{}
	for _, rt := range append(s.workerRoutes(), s.operatorRoutes()...) {
		key := rt.method + " " + rt.path
		if _, dup := served[key]; dup {
			t.Errorf("route %s is served twice", key)
		}
		served[key] = rt
	}
	documented := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			documented[method+" "+path] = op
		}
	}
	for key := range served {
		if documented[key] == nil {
			t.Errorf("route %s is served but not in openapi.json", key)
		}
	}
	for key := range documented {
		if _, ok := served[key]; !ok {
			t.Errorf("openapi.json has %s, which no handler serves", key)
		}
	}
	for key, rt := range served {
		op := documented[key]
		if op == nil {
			continue
		}
		t.Run(key, func(t *testing.T) {
			oasCheckOperation(t, doc, rt, op)
		})
	}
}

func oasCheckOperation(t *testing.T, doc *openapi3.T, rt route, op *openapi3.Operation) {
	if op.Security == nil {
		t.Fatalf("no security of its own")
	}
	sec := *op.Security
	switch {
	case rt.public:
		if len(sec) != 0 {
			t.Errorf("public route has security %v", sec)
		}
	case len(sec) != 1:
		t.Errorf("want one security requirement, have %d", len(sec))
	default:
		want := openapi3.SecurityRequirement{"bearer": {string(rt.scope)}}
		if rt.signed {
			want["contentDigest"], want["signatureInput"], want["signature"] = []string{}, []string{}, []string{}
		}
		if !reflect.DeepEqual(sec[0], want) {
			t.Errorf("security is %v, want %v", sec[0], want)
		}
		for name := range sec[0] {
			if doc.Components.SecuritySchemes[name] == nil {
				t.Errorf("security scheme %s is not defined", name)
			}
		}
	}
	// Path parameters are exactly the pattern's wildcards.
	item := doc.Paths.Value(rt.path)
	var params []string
	for _, p := range append(item.Parameters, op.Parameters...) {
		if p.Value.In == openapi3.ParameterInPath {
			params = append(params, p.Value.Name)
		}
	}
	var wild []string
	for _, seg := range strings.Split(rt.path, "/") {
		if strings.HasPrefix(seg, "{") {
			wild = append(wild, strings.Trim(seg, "{}"))
		}
	}
	if !slices.Equal(params, wild) {
		t.Errorf("path parameters %v, want %v", params, wild)
	}
	// Query parameters are exactly those the route accepts (checkQuery
	// refuses any other).
	var query []string
	for _, p := range append(item.Parameters, op.Parameters...) {
		if p.Value.In == openapi3.ParameterInQuery {
			query = append(query, p.Value.Name)
		}
	}
	if rt.method == http.MethodGet && !rt.public && !slices.Equal(slices.Sorted(slices.Values(query)), slices.Sorted(slices.Values(rt.query))) {
		t.Errorf("query parameters %v, want %v", query, rt.query)
	}
	// Statuses every non-public route can answer.
	codes := op.Responses.Map()
	if !rt.public {
		want := []string{"401", "403", "413", "503"}
		if rt.method != http.MethodGet {
			want = append(want, "415")
		}
		if !rt.signed {
			want = append(want, "400") // an unknown query parameter, on GET
		} else if rt.method != http.MethodGet {
			want = append(want, "400")
		}
		if rt.signed {
			want = append(want, "429")
		}
		if strings.Contains(rt.path, "{id}") {
			want = append(want, "404")
		}
		for _, c := range want {
			if codes[c] == nil {
				t.Errorf("no %s response", c)
			}
		}
	}
	if rt.method == http.MethodGet && op.RequestBody != nil {
		t.Errorf("GET with a request body")
	}
	if rt.method == http.MethodPost && !rt.public && op.RequestBody == nil {
		t.Errorf("POST without a request body")
	}
	if codes["405"] != nil {
		t.Errorf("405 belongs to the methods a path does not serve, not to an operation")
	}
	ok := false
	for c := range codes {
		if c[0] == '2' {
			ok = true
		}
	}
	if !ok {
		t.Errorf("no 2xx response")
	}
}

// oasWireSchemas maps the wire types to their schemas. Response types must
// match strictly: every field always present is required, and only
// pointers are nullable.
var oasWireSchemas = []struct {
	schema   string
	typ      any
	response bool
}{
	{"Error", wire.ErrorBody{}, true},
	{"ErrorDetail", wire.ErrorDetail{}, true},
	{"GPU", wire.GPU{}, true},
	{"Capabilities", wire.Capabilities{}, true},
	{"GovernorLimits", wire.GovernorLimits{}, true},
	{"GPUInput", wire.GPU{}, false},
	{"CapabilitiesInput", wire.Capabilities{}, false},
	{"GovernorLimitsInput", wire.GovernorLimits{}, false},
	{"RegisterRequest", wire.RegisterRequest{}, false},
	{"RegisterResponse", wire.RegisterResponse{}, true},
	{"StartRequest", wire.StartRequest{}, false},
	{"StartResponse", wire.StartResponse{}, true},
	{"RenewTokenRequest", wire.RenewTokenRequest{}, false},
	{"RenewTokenResponse", wire.RenewTokenResponse{}, true},
	{"HeartbeatRequest", wire.HeartbeatRequest{}, false},
	{"HeartbeatResponse", wire.HeartbeatResponse{}, true},
	{"SignalsRequest", wire.SignalsRequest{}, false},
	{"SignalsResponse", wire.SignalsResponse{}, true},
	{"LeaseExpiry", wire.LeaseExpiry{}, true},
	{"LeaseRequest", wire.LeaseRequest{}, false},
	{"Requirements", wire.Requirements{}, true},
	{"RequirementsInput", wire.Requirements{}, false},
	{"JobError", wire.JobError{}, true},
	{"Job", wire.Job{}, true},
	{"OperatorJob", wire.OperatorJob{}, true},
	{"OperatorJobResponse", wire.OperatorJobResponse{}, true},
	{"Grant", wire.Grant{}, true},
	{"LeaseResponse", wire.LeaseResponse{}, true},
	{"AcceptRequest", wire.TokenRequest{}, false},
	{"AcceptResponse", wire.AcceptResponse{}, true},
	{"StatusRequest", wire.StatusRequest{}, false},
	{"StatusResponse", wire.StatusResponse{}, true},
	{"LogEntry", wire.LogEntry{}, false},
	{"LogsRequest", wire.LogsRequest{}, false},
	{"LogsResponse", wire.LogsResponse{}, true},
	{"ArtifactRequest", wire.ArtifactRequest{}, false},
	{"ArtifactResponse", wire.ArtifactResponse{}, true},
	{"CompleteRequest", wire.CompleteRequest{}, false},
	{"CompleteResponse", wire.CompleteResponse{}, true},
	{"CompleteBatchRequest", wire.CompleteBatchRequest{}, false},
	{"Completion", wire.Completion{}, false},
	{"CompleteBatchResponse", wire.CompleteBatchResponse{}, true},
	{"CompletionResult", wire.CompletionResult{}, true},
	{"CompletedJob", wire.CompletedJob{}, true},
	{"FailRequest", wire.FailRequest{}, false},
	{"FailResponse", wire.FailResponse{}, true},
	{"ReleaseRequest", wire.ReleaseRequest{}, false},
	{"JobResponse", wire.JobResponse{}, true},
	{"AuditEvent", wire.AuditEvent{}, false},
	{"AuditRequest", wire.AuditRequest{}, false},
	{"AuditResponse", wire.AuditResponse{}, true},
	{"Receipt", receipts.WireReceipt{}, true},
	{"Proof", receipts.Proof{}, true},
	// Operator routes.
	{"DispatchRequest", wire.DispatchRequest{}, false},
	{"DispatchResponse", wire.DispatchResponse{}, true},
	{"JobListResponse", wire.JobListResponse{}, true},
	{"JobResult", wire.JobResult{}, true},
	{"JobEventView", wire.JobEventView{}, true},
	{"JobDetailResponse", wire.JobDetailResponse{}, true},
	{"ArtifactView", wire.ArtifactView{}, true},
	{"ArtifactListResponse", wire.ArtifactListResponse{}, true},
	{"WorkerView", wire.WorkerView{}, true},
	{"WorkerListResponse", wire.WorkerListResponse{}, true},
	{"WorkerLease", wire.WorkerLease{}, true},
	{"WorkerDetailResponse", wire.WorkerDetailResponse{}, true},
	{"WorkerResponse", wire.WorkerResponse{}, true},
	{"ReasonRequest", wire.ReasonRequest{}, false},
	{"ApproveRequest", wire.ApproveRequest{}, false},
	{"DeactivateRequest", wire.ReasonRequest{}, false},
	{"ActivateRequest", wire.ActivateRequest{}, false},
	{"MintCredentialRequest", wire.MintCredentialRequest{}, false},
	{"MintCredentialResponse", wire.MintCredentialResponse{}, true},
	{"RevokeCredentialResponse", wire.RevokeCredentialResponse{}, true},
	{"CredentialView", wire.CredentialView{}, true},
	{"CredentialListResponse", wire.CredentialListResponse{}, true},
	{"CreatePrincipalRequest", wire.CreatePrincipalRequest{}, false},
	{"CreatePrincipalResponse", wire.CreatePrincipalResponse{}, true},
	{"EnvelopeResponse", wire.EnvelopeResponse{}, true},
	{"ReceiptListResponse", wire.ReceiptListResponse{}, true},
	{"ReceiptResponse", wire.ReceiptResponse{}, true},
	{"ConsistencyResponse", wire.ConsistencyResponse{}, true},
	{"CostSum", wire.CostSum{}, true},
	{"CostGroup", wire.CostGroup{}, true},
	{"UnbilledSum", wire.UnbilledSum{}, true},
	{"UnbilledGroup", wire.UnbilledGroup{}, true},
	{"Unbilled", wire.Unbilled{}, true},
	{"CostReport", wire.CostReport{}, true},
}

// TestOpenAPIWireTypes checks that each wire type marshals to JSON whose field names
// are exactly its schema's properties, with compatible types, and for
// response types the fields always present are exactly the required ones.
func TestOpenAPIWireTypes(t *testing.T) {
	doc := loadOpenAPIDoc(t)
	mapped := map[string]bool{}
	for _, w := range oasWireSchemas {
		mapped[w.schema] = true
		t.Run(w.schema, func(t *testing.T) {
			ref := doc.Components.Schemas[w.schema]
			if ref == nil {
				t.Fatalf("no schema %s", w.schema)
			}
			typ := reflect.TypeOf(w.typ)
			oasCheckStruct(t, w.schema, typ, ref.Value, w.response)
			// What the type marshals to, zero and filled, has the
			// schema's names.
			for _, v := range []reflect.Value{reflect.New(typ).Elem(), oasFilled(typ, 0)} {
				b, err := json.Marshal(v.Interface())
				if err != nil {
					t.Fatal(err)
				}
				var m map[string]json.RawMessage
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatal(err)
				}
				for name := range m {
					if _, ok := ref.Value.Properties[name]; !ok {
						t.Errorf("%s marshals %q, which the schema lacks", typ, name)
					}
				}
				if w.response {
					for _, name := range ref.Value.Required {
						if _, ok := m[name]; !ok {
							t.Errorf("%s does not always marshal required %q", typ, name)
						}
					}
				}
			}
		})
	}
	// Every object schema with properties is mapped to a wire type.
	for name, ref := range doc.Components.Schemas {
		if len(ref.Value.Properties) > 0 && !mapped[name] {
			t.Errorf("schema %s is mapped to no wire type in oasWireSchemas", name)
		}
	}
}

var (
	oasTimeType    = reflect.TypeFor[time.Time]()
	oasRawType     = reflect.TypeFor[json.RawMessage]()
	oasHashType    = reflect.TypeFor[tlog.Hash]()
	oasReceiptKind = reflect.TypeFor[receipts.Kind]()
)

type oasJSONField struct {
	name      string
	omitempty bool
	typ       reflect.Type
}

// oasJSONFields lists the fields encoding/json writes for struct type t.
func oasJSONFields(t reflect.Type) []oasJSONField {
	var out []oasJSONField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			out = append(out, oasJSONFields(f.Type)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, oasJSONField{name: name, omitempty: strings.Contains(","+opts+",", ",omitempty,"), typ: f.Type})
	}
	return out
}

func oasCheckStruct(t *testing.T, where string, typ reflect.Type, s *openapi3.Schema, response bool) {
	t.Helper()
	fields := oasJSONFields(typ)
	names := map[string]bool{}
	for _, f := range fields {
		names[f.name] = true
		p := s.Properties[f.name]
		if p == nil {
			t.Errorf("%s: field %s.%s (%s) is not a property of the schema", where, typ, f.name, f.typ)
			continue
		}
		oasCheckField(t, where+"."+f.name, f.typ, p, response, slices.Contains(s.Required, f.name))
		if response && !slices.Contains(s.Required, f.name) && !f.omitempty {
			t.Errorf("%s: %s is always present but not required", where, f.name)
		}
		if response && slices.Contains(s.Required, f.name) && f.omitempty {
			t.Errorf("%s: %s is omitempty but required", where, f.name)
		}
	}
	for name := range s.Properties {
		if !names[name] {
			t.Errorf("%s: property %q is no field of %s", where, name, typ)
		}
	}
}

// oasUnwrap returns the schema's types and the schema that carries them,
// seeing through anyOf [X, {type: null}].
func oasUnwrap(s *openapi3.SchemaRef) (types []string, inner *openapi3.SchemaRef) {
	v := s.Value
	if len(v.AnyOf) == 2 {
		for i, alt := range v.AnyOf {
			if alt.Value.Type.Is("null") {
				other := v.AnyOf[1-i]
				types, inner = oasUnwrap(other)
				return append(types, "null"), inner
			}
		}
	}
	if v.Type != nil {
		types = append(types, *v.Type...)
	}
	return types, s
}

// oasCheckField checks the schema of one field of Go type typ. A
// pointer is nullable, except in a request where it tells a required
// field's presence.
func oasCheckField(t *testing.T, where string, typ reflect.Type, ref *openapi3.SchemaRef, response, required bool) {
	t.Helper()
	types, inner := oasUnwrap(ref)
	nullable := slices.Contains(types, "null")
	if typ.Kind() == reflect.Pointer {
		if !nullable && (response || !required) {
			t.Errorf("%s: %s is a pointer but the schema is not nullable (%v)", where, typ, types)
		}
		typ = typ.Elem()
	} else if nullable && response && typ != oasRawType {
		t.Errorf("%s: %s is never null but the schema is nullable", where, typ)
	}
	is := func(want string) {
		t.Helper()
		if !slices.Contains(types, want) {
			t.Errorf("%s: %s wants schema type %s, have %v", where, typ, want, types)
		}
	}
	switch {
	case typ == oasTimeType:
		is("string")
		if inner.Value.Format != "date-time" {
			t.Errorf("%s: time without format date-time", where)
		}
	case typ == oasRawType:
		// Free-form JSON: any type is fine.
	case typ == oasHashType:
		is("string")
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Uint8:
		is("string")
	case typ.Kind() == reflect.String:
		is("string")
		if typ == oasReceiptKind && len(inner.Value.Enum) == 0 {
			t.Errorf("%s: receipt kind without enum", where)
		}
	case typ.Kind() == reflect.Bool:
		is("boolean")
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Uint64:
		is("integer")
	case typ.Kind() == reflect.Slice:
		is("array")
		if inner.Value.Items == nil {
			t.Errorf("%s: array without items", where)
			return
		}
		oasCheckField(t, where+"[]", typ.Elem(), inner.Value.Items, response, false)
	case typ.Kind() == reflect.Struct:
		if inner.Ref == "" {
			t.Errorf("%s: struct %s is not a $ref", where, typ)
		}
		is("object")
		// The referenced schema is checked against its own wire type.
		name := strings.TrimPrefix(inner.Ref, "#/components/schemas/")
		for _, w := range oasWireSchemas {
			if w.schema == name && reflect.TypeOf(w.typ) != typ {
				t.Errorf("%s: %s refers to %s, which maps to %T", where, typ, name, w.typ)
			}
			if w.schema == name && w.response != response {
				t.Errorf("%s: a %s refers to %s, which is not", where, oasDirection(response), name)
			}
		}
	default:
		t.Errorf("%s: no rule for %s", where, typ)
	}
}

func oasDirection(response bool) string {
	if response {
		return "response"
	}
	return "request"
}

// oasFilled returns a value of t with every field set, so that omitempty
// fields marshal too.
func oasFilled(t reflect.Type, depth int) reflect.Value {
	v := reflect.New(t).Elem()
	switch {
	case t == oasTimeType:
		v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)))
	case t == oasRawType:
		v.Set(reflect.ValueOf(json.RawMessage(`{"k":1}`)))
	case t.Kind() == reflect.Pointer:
		v.Set(oasFilled(t.Elem(), depth).Addr())
	case t.Kind() == reflect.String:
		v.SetString("x")
	case t.Kind() == reflect.Bool:
		v.SetBool(true)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		v.SetInt(1)
	case t.Kind() == reflect.Slice && depth < 4:
		s := reflect.MakeSlice(t, 1, 1)
		s.Index(0).Set(oasFilled(t.Elem(), depth+1))
		v.Set(s)
	case t.Kind() == reflect.Struct && depth < 4:
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				v.Field(i).Set(oasFilled(t.Field(i).Type, depth+1))
			}
		}
	}
	return v
}

// TestOpenAPIServed checks that GET /workers/openapi.json answers the document,
// without a credential, on both handlers that mount it.
func TestOpenAPIServed(t *testing.T) {
	s := newFuzzServer(t, time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	var want bytes.Buffer
	if err := json.Compact(&want, openAPIDocument); err != nil {
		t.Fatal(err)
	}
	want.WriteByte('\n')
	for name, h := range map[string]http.Handler{"Handler": s.Handler(), "WorkerHandler": s.WorkerHandler()} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/workers/openapi.json", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", name, rec.Code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", name, ct)
		}
		if !bytes.Equal(rec.Body.Bytes(), want.Bytes()) {
			t.Errorf("%s: the body is not the embedded document", name)
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/workers/openapi.json", nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != http.MethodGet {
			t.Errorf("%s: POST answers %d with Allow %q", name, rec.Code, rec.Header().Get("Allow"))
		}
	}
	rec := httptest.NewRecorder()
	s.OperatorHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/workers/openapi.json", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("OperatorHandler serves the document: %d", rec.Code)
	}
}

// openAPIChecker checks answers of the handlers against the document: the
// status is one the route's operation lists (or 404 off the routes, 405
// for another method), the body is JSON of the schema of that status
// (with additionalProperties false on every response object, so that a
// field the document lacks is caught), and an error's code belongs to
// its status.
type openAPIChecker struct {
	doc     *openapi3.T
	raw     map[string]any
	mux     *http.ServeMux
	methods map[string][]string // by path pattern
	byCode  map[string]int

	mu       sync.Mutex
	compiler *jsonschema.Compiler // responses: strict, formats asserted
	lenient  *jsonschema.Compiler // requests: the document as published
	schemas  map[string]*jsonschema.Schema
	n        int
}

const openAPIBase = "https://nodelane.test/openapi.json"

var (
	openAPICheckerOnce sync.Once
	openAPICheckerV    *openAPIChecker
	openAPICheckerErr  error
)

func getOpenAPIChecker(t testing.TB) *openAPIChecker {
	t.Helper()
	openAPICheckerOnce.Do(func() { openAPICheckerV, openAPICheckerErr = newOpenAPIChecker() })
	if openAPICheckerErr != nil {
		t.Fatal(openAPICheckerErr)
	}
	return openAPICheckerV
}

func newOpenAPIChecker() (*openAPIChecker, error) {
	doc, err := openapi3.NewLoader().LoadFromData(openAPIDocument)
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(openAPIDocument, &raw); err != nil {
		return nil, err
	}
	c := &openAPIChecker{doc: doc, raw: raw, mux: http.NewServeMux(), methods: map[string][]string{},
		byCode: oasErrorStatuses(), schemas: map[string]*jsonschema.Schema{}}
	s := &Server{}
	for _, rt := range append(s.workerRoutes(), s.operatorRoutes()...) {
		if c.methods[rt.path] == nil {
			c.mux.HandleFunc(rt.path, func(http.ResponseWriter, *http.Request) {})
		}
		c.methods[rt.path] = append(c.methods[rt.path], rt.method)
	}
	// Response objects are strict here: the published document leaves
	// them open so that clients tolerate additions, but the handlers must
	// not answer a field the document does not describe.
	strict, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPIDocument))
	if err != nil {
		return nil, err
	}
	schemas := strict.(map[string]any)["components"].(map[string]any)["schemas"].(map[string]any)
	for _, w := range oasWireSchemas {
		if w.response {
			schemas[w.schema].(map[string]any)["additionalProperties"] = false
		}
	}
	c.compiler = jsonschema.NewCompiler()
	c.compiler.DefaultDraft(jsonschema.Draft2020)
	c.compiler.AssertFormat()
	c.compiler.AssertContent()
	if err := c.compiler.AddResource(openAPIBase, strict); err != nil {
		return nil, err
	}
	// Requests are checked against the document as published, formats
	// not asserted: Go's decoder is lenient with times (it takes
	// "2026-11-30T9:00:00Z", with a one-digit hour), which is harmless.
	open, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPIDocument))
	if err != nil {
		return nil, err
	}
	c.lenient = jsonschema.NewCompiler()
	c.lenient.DefaultDraft(jsonschema.Draft2020)
	if err := c.lenient.AddResource(openAPIOpenBase, open); err != nil {
		return nil, err
	}
	return c, nil
}

const openAPIOpenBase = "https://nodelane.test/openapi-open.json"

// requestSchemaFor compiles the request body schema of an operation; nil
// if it has none.
func (c *openAPIChecker) requestSchemaFor(method, pattern string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := "request " + method + " " + pattern
	if s, ok := c.schemas[key]; ok {
		return s, nil
	}
	var s *jsonschema.Schema
	if schema := oasDig(c.raw, "paths", pattern, strings.ToLower(method), "requestBody", "content", "application/json", "schema"); schema != nil {
		c.n++
		url := fmt.Sprintf("https://nodelane.test/inline/%d.json", c.n)
		if err := c.lenient.AddResource(url, oasAbsoluteRefs(schema, openAPIOpenBase)); err != nil {
			return nil, err
		}
		var err error
		if s, err = c.lenient.Compile(url); err != nil {
			return nil, err
		}
	}
	c.schemas[key] = s
	return s, nil
}

// checkAccepted returns an error if the handlers accepted (2xx) a request
// body that the document's request schema refuses: the document would be
// stricter than the server. Bodies whose keys Go's decoder would match
// case-insensitively are skipped.
func (c *openAPIChecker) checkAccepted(r *http.Request, status int, body []byte) error {
	pattern, served := c.match(r)
	if !served || status/100 != 2 || len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	s, err := c.requestSchemaFor(r.Method, pattern)
	if err != nil || s == nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil || !oasPlainKeys(v) {
		return nil
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %s: the handlers accepted (%d) a body the document refuses: %v\nbody: %s", r.Method, r.URL, status, err, oasTruncate(body))
	}
	return nil
}

// oasPlainKeys reports whether every object key in v is lowercase ASCII,
// digits and underscores, which Go's decoder matches exactly.
func oasPlainKeys(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if strings.Trim(k, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" || !oasPlainKeys(e) {
				return false
			}
		}
	case []any:
		for _, e := range v {
			if !oasPlainKeys(e) {
				return false
			}
		}
	}
	return true
}

// schemaFor compiles the schema of one response of one operation.
func (c *openAPIChecker) schemaFor(method, pattern, status, contentType string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := method + " " + pattern + " " + status + " " + contentType
	if s, ok := c.schemas[key]; ok {
		return s, nil
	}
	resp := oasDig(c.raw, "paths", pattern, strings.ToLower(method), "responses", status)
	if ref, ok := oasDig(resp, "$ref").(string); ok {
		resp = oasDig(c.raw, "components", "responses", strings.TrimPrefix(ref, "#/components/responses/"))
	}
	schema := oasDig(resp, "content", contentType, "schema")
	if schema == nil {
		return nil, fmt.Errorf("%s %s: no %s schema for %s", method, pattern, contentType, status)
	}
	// The inline schema is compiled as a resource of its own, its
	// references made absolute.
	c.n++
	url := fmt.Sprintf("https://nodelane.test/inline/%d.json", c.n)
	if err := c.compiler.AddResource(url, oasAbsoluteRefs(schema, openAPIBase)); err != nil {
		return nil, err
	}
	s, err := c.compiler.Compile(url)
	if err != nil {
		return nil, err
	}
	c.schemas[key] = s
	return s, nil
}

// oasDig returns the value at keys in nested JSON objects, or nil.
func oasDig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func oasAbsoluteRefs(v any, base string) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if s, ok := e.(string); ok && k == "$ref" && strings.HasPrefix(s, "#") {
				out[k] = base + s
				continue
			}
			out[k] = oasAbsoluteRefs(e, base)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = oasAbsoluteRefs(e, base)
		}
		return out
	}
	return v
}

// match returns the route pattern r reaches ("" for none) and whether the
// pattern serves r's method.
func (c *openAPIChecker) match(r *http.Request) (pattern string, served bool) {
	if !isCleanPath(r.URL.Path) {
		return "", false // ServeMux would redirect; the handlers answer 404
	}
	_, pattern = c.mux.Handler(r)
	if c.methods[pattern] == nil {
		return "", false
	}
	return pattern, slices.Contains(c.methods[pattern], r.Method)
}

// check returns what is wrong with the answer rec to r, or nil.
func (c *openAPIChecker) check(r *http.Request, status int, h http.Header, body []byte) error {
	if status >= 500 && status != http.StatusServiceUnavailable || status < 200 {
		return fmt.Errorf("status %d", status)
	}
	pattern, served := c.match(r)
	ct := h.Get("Content-Type")
	var want []string
	switch {
	case pattern == "":
		want = []string{"404"}
	case !served:
		want = []string{"405"}
		if allow := h.Get("Allow"); allow != strings.Join(c.methods[pattern], ", ") {
			return fmt.Errorf("405 with Allow %q", allow)
		}
	default:
		for code := range c.doc.Paths.Value(pattern).GetOperation(r.Method).Responses.Map() {
			want = append(want, code)
		}
	}
	code := strconv.Itoa(status)
	if !slices.Contains(want, code) {
		return fmt.Errorf("%s %s (route %q) answered %d, which the document does not list (%v): %s",
			r.Method, r.URL, pattern, status, want, oasTruncate(body))
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if h.Get("Retry-After") == "" {
			return fmt.Errorf("%d without Retry-After", status)
		}
	}
	if status >= 400 {
		if err := c.checkError(status, ct, body); err != nil {
			return err
		}
	}
	if pattern == "" || !served {
		return nil
	}
	if ct == "text/plain; charset=utf-8" {
		ct = "text/plain"
	}
	s, err := c.schemaFor(r.Method, pattern, code, ct)
	if err != nil {
		return fmt.Errorf("%s %s answered %d with Content-Type %q: %v", r.Method, r.URL, status, h.Get("Content-Type"), err)
	}
	var v any
	if ct == "application/json" {
		if v, err = jsonschema.UnmarshalJSON(bytes.NewReader(body)); err != nil {
			return fmt.Errorf("%s %s answered %d with a body that is not JSON: %v: %s", r.Method, r.URL, status, err, oasTruncate(body))
		}
	} else {
		v = string(body)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %s answered %d with a body the document does not describe: %v\nbody: %s", r.Method, r.URL, status, err, oasTruncate(body))
	}
	return nil
}

func (c *openAPIChecker) checkError(status int, ct string, body []byte) error {
	if ct != "application/json" {
		return fmt.Errorf("error %d with Content-Type %q", status, ct)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var e wire.ErrorBody
	if err := dec.Decode(&e); err != nil {
		return fmt.Errorf("error %d is not an error body: %v: %s", status, err, oasTruncate(body))
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimSpace(rest)) != 0 {
		return fmt.Errorf("error %d has trailing data: %s", status, oasTruncate(body))
	}
	if want, ok := c.byCode[e.Error.Code]; !ok || want != status {
		return fmt.Errorf("error %d has code %q (of status %d): %s", status, e.Error.Code, want, oasTruncate(body))
	}
	if e.Error.Message == "" || e.Error.ServerTime.IsZero() {
		return fmt.Errorf("error %d lacks a message or server_time: %s", status, oasTruncate(body))
	}
	return nil
}

func oasTruncate(b []byte) string {
	if len(b) > 600 {
		return string(b[:600]) + "..."
	}
	return string(b)
}

// TestOpenAPICheckerCatches checks that the checker that FuzzHandler relies on
// refuses answers that drift from the document.
func TestOpenAPICheckerCatches(t *testing.T) {
	c := getOpenAPIChecker(t)
	const (
		hb      = `{"ok":true,"worker_id":"w","server_time":"2026-11-30T09:00:00Z","next_heartbeat_seconds":30,"heartbeat_deadline":"2026-11-30T09:01:30Z","policy_version":1,"leases":[],"lost_jobs":[],"cancel_jobs":[],"ended_jobs":[],"drain":false}`
		errBody = `{"error":{"code":%q,"message":"m","server_time":"2026-11-30T09:00:00Z"}}`
	)
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name         string
		method, path string
		status       int
		header       http.Header
		body         string
		ok           bool
	}{
		{"good", "POST", "/workers/heartbeat", 200, jsonCT, hb, true},
		{"extra field", "POST", "/workers/heartbeat", 200, jsonCT, strings.Replace(hb, `"ok":true`, `"ok":true,"extra":1`, 1), false},
		{"missing field", "POST", "/workers/heartbeat", 200, jsonCT, strings.Replace(hb, `"lost_jobs":[],`, ``, 1), false},
		{"null array", "POST", "/workers/heartbeat", 200, jsonCT, strings.Replace(hb, `"lost_jobs":[]`, `"lost_jobs":null`, 1), false},
		{"bad time", "POST", "/workers/heartbeat", 200, jsonCT, strings.Replace(hb, `2026-11-30T09:00:00Z`, `yesterday`, 1), false},
		{"not JSON", "POST", "/workers/heartbeat", 200, jsonCT, `{"ok":`, false},
		{"wrong content type", "POST", "/workers/heartbeat", 200, http.Header{"Content-Type": {"text/plain"}}, hb, false},
		{"undocumented status", "POST", "/workers/heartbeat", 409, jsonCT, fmt.Sprintf(errBody, "lease_lost"), false},
		{"code of another status", "POST", "/workers/heartbeat", 401, jsonCT, fmt.Sprintf(errBody, "not_found"), false},
		{"good error", "POST", "/workers/heartbeat", 401, jsonCT, fmt.Sprintf(errBody, "replayed_nonce"), true},
		{"code of another route", "POST", "/workers/heartbeat", 403, jsonCT, fmt.Sprintf(errBody, "blocked_by_envelope"), false},
		{"code of this route", "POST", "/workers/jobs/j1/accept", 403, jsonCT, fmt.Sprintf(errBody, "blocked_by_envelope"), true},
		{"error with extra field", "POST", "/workers/heartbeat", 400, jsonCT, `{"error":{"code":"invalid_request","message":"m","server_time":"2026-11-30T09:00:00Z","x":1}}`, false},
		{"503 without Retry-After", "POST", "/workers/heartbeat", 503, jsonCT, fmt.Sprintf(errBody, "unavailable"), false},
		{"500", "POST", "/workers/heartbeat", 500, jsonCT, fmt.Sprintf(errBody, "unavailable"), false},
		{"405 without Allow", "GET", "/workers/heartbeat", 405, jsonCT, fmt.Sprintf(errBody, "method_not_allowed"), false},
		{"405", "GET", "/workers/heartbeat", 405, http.Header{"Content-Type": {"application/json"}, "Allow": {"POST"}}, fmt.Sprintf(errBody, "method_not_allowed"), true},
		{"404", "GET", "/nope", 404, jsonCT, fmt.Sprintf(errBody, "not_found"), true},
		{"404 as text", "GET", "/nope", 404, http.Header{"Content-Type": {"text/plain"}}, "404 page not found", false},
		{"200 off the routes", "GET", "/nope", 200, jsonCT, `{}`, false},
		{"checkpoint", "GET", "/operator/receipts/checkpoint", 200, http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, "origin\n1\nAAAA\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.check(httptest.NewRequest(tc.method, tc.path, nil), tc.status, tc.header, []byte(tc.body))
			if (err == nil) != tc.ok {
				t.Errorf("check = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
