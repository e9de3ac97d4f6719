package workerapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The OpenAPI document is held to the code three ways: it validates as
// OpenAPI 3.1 (kin-openapi, in the programs' module: cmd/openapi_test.go,
// so that kin-openapi stays out of the library's module graph), its
// operations are exactly the routes the handlers serve with their scopes,
// and its schemas have exactly the fields of the wire types. Answers of
// the running handlers are checked against it too (openAPIChecker, with
// jsonschema), here and by FuzzHandler. Here the document is read as
// encoding/json decodes it: objects are map[string]any, arrays []any.

// loadOpenAPIDoc decodes the embedded document and checks that it is
// OpenAPI 3.1 and that each of its references resolves, as a loader
// would.
func loadOpenAPIDoc(t testing.TB) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatalf("decoding openapi.json: %v", err)
	}
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Fatalf("openapi.json is OpenAPI %q, want 3.1", v)
	}
	if bad := oasUnresolved(doc, doc, "#"); len(bad) > 0 {
		t.Fatalf("loading openapi.json: references that resolve to nothing: %s", strings.Join(bad, "; "))
	}
	return doc
}

// oasUnresolved lists the references under v (at JSON pointer at) that
// are not local or resolve to no object of doc.
func oasUnresolved(doc map[string]any, v any, at string) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok {
			if _, ok := oasPointer(doc, ref).(map[string]any); !ok {
				out = append(out, at+": "+ref)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			out = append(out, oasUnresolved(doc, v[k], at+"/"+k)...)
		}
	case []any:
		for i, e := range v {
			out = append(out, oasUnresolved(doc, e, at+"/"+strconv.Itoa(i))...)
		}
	}
	return out
}

// oasPointer returns what a local reference ("#/components/…") points
// to in doc, or nil.
func oasPointer(doc map[string]any, ref string) any {
	p, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil
	}
	var keys []string
	for _, k := range strings.Split(p, "/") {
		keys = append(keys, strings.NewReplacer("~1", "/", "~0", "~").Replace(k))
	}
	return oasDig(doc, keys...)
}

// oasDeref returns the object v is, following its $ref through doc, or
// nil when v is no object. (loadOpenAPIDoc has checked that every
// reference resolves.)
func oasDeref(doc map[string]any, v any) map[string]any {
	for range 32 {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		v = oasPointer(doc, ref)
	}
	return nil // a cycle of references
}

// oasObject returns the object at keys under v, or nil.
func oasObject(v any, keys ...string) map[string]any {
	m, _ := oasDig(v, keys...).(map[string]any)
	return m
}

// oasStrings returns the strings of a JSON array; any other element is
// written with %v.
func oasStrings(v any) []string {
	a, _ := v.([]any)
	out := make([]string, 0, len(a))
	for _, e := range a {
		s, ok := e.(string)
		if !ok {
			s = fmt.Sprintf("%v", e)
		}
		out = append(out, s)
	}
	return out
}

// oasTypes returns a schema's type, a string or an array of them in
// OpenAPI 3.1, as a list; nil if it has none.
func oasTypes(s map[string]any) []string {
	switch v := s["type"].(type) {
	case string:
		return []string{v}
	case []any:
		return oasStrings(v)
	}
	return nil
}

// oasMethods are the operations a path item may hold.
var oasMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace", "query"}

// oasOperations returns the document's operations by "METHOD /path"
// (the method upper case, as the routes have it). A path item's key that
// is neither an operation nor one of the fields beside them is reported.
func oasOperations(t *testing.T, doc map[string]any) map[string]map[string]any {
	t.Helper()
	ops := map[string]map[string]any{}
	for path, v := range oasObject(doc, "paths") {
		item := oasDeref(doc, v)
		for key, op := range item {
			switch {
			case slices.Contains(oasMethods, key):
				m, ok := op.(map[string]any)
				if !ok {
					t.Errorf("%s %s is no object", key, path)
					continue
				}
				ops[strings.ToUpper(key)+" "+path] = m
			case !slices.Contains([]string{"summary", "description", "servers", "parameters"}, key) && !strings.HasPrefix(key, "x-"):
				t.Errorf("path %s has %q, which is no operation", path, key)
			}
		}
	}
	if len(ops) == 0 {
		t.Fatal("openapi.json has no operations")
	}
	return ops
}

// TestOpenAPIResolves checks the reference walk that loadOpenAPIDoc
// relies on: oasUnresolved reports a reference to a missing name and a
// remote one, and no other, and oasDeref follows a reference.
func TestOpenAPIResolves(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	if bad := oasUnresolved(doc, map[string]any{"a": []any{map[string]any{"$ref": "#/components/schemas/Nope"}}, "b": map[string]any{"$ref": "#/components/schemas/Job"}}, "#"); !slices.Equal(bad, []string{"#/a/0: #/components/schemas/Nope"}) {
		t.Errorf("oasUnresolved = %q, want only the reference to Nope", bad)
	}
	if bad := oasUnresolved(doc, map[string]any{"$ref": "https://example.com/x.json"}, "#"); len(bad) != 1 {
		t.Errorf("a remote reference is not reported: %q", bad)
	}
	if got := oasDeref(doc, map[string]any{"$ref": "#/components/responses/NotFound"}); got == nil || got["description"] == nil {
		t.Errorf("oasDeref of NotFound = %v", got)
	}
}

// TestOpenAPIEnums holds the document's enums to the code's lists.
func TestOpenAPIEnums(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	enum := func(schema, prop string) []string {
		t.Helper()
		s := oasDeref(doc, oasDig(doc, "components", "schemas", schema))
		if prop != "" {
			s = oasDeref(doc, oasDig(s, "properties", prop))
		}
		out := oasStrings(s["enum"])
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
	responses := oasObject(doc, "components", "responses")
	if len(responses) == 0 {
		t.Fatal("openapi.json has no components/responses")
	}
	for name, ref := range responses {
		if name == "RangeNotSatisfiable" {
			// http.ServeContent's 416: plain text, no error object.
			if _, ok := oasDeref(doc, ref)["content"]; ok {
				t.Errorf("response %s: describes a body, but net/http writes its own text", name)
			}
			continue
		}
		s := oasDeref(doc, oasDig(oasDeref(doc, ref), "content", "application/json", "schema"))
		allOf, _ := s["allOf"].([]any)
		if len(allOf) != 2 {
			t.Errorf("response %s: want allOf [Error, code enum]", name)
			continue
		}
		var status int
		codes := oasStrings(oasDig(oasDeref(doc, oasDig(oasDeref(doc, oasDig(oasDeref(doc, allOf[1]), "properties", "error")), "properties", "code")), "enum"))
		if len(codes) == 0 {
			t.Errorf("response %s: no code enum", name)
		}
		for _, v := range codes {
			st, ok := byCode[v]
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
	t.Parallel()
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
	documented := oasOperations(t, doc)
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
			t.Parallel()
			oasCheckOperation(t, doc, rt, op)
		})
	}
}

// oasSecurity returns a security requirement as a map from scheme to
// scopes, every list non-nil.
func oasSecurity(v any) map[string][]string {
	out := map[string][]string{}
	for name, scopes := range oasObject(v) {
		out[name] = oasStrings(scopes)
	}
	return out
}

// oasParameters returns the names of the parameters in "path" or "query"
// of an operation and its path item.
func oasParameters(doc, item, op map[string]any, in string) []string {
	var out []string
	for _, list := range []any{item["parameters"], op["parameters"]} {
		ps, _ := list.([]any)
		for _, p := range ps {
			p := oasDeref(doc, p)
			if p["in"] == in {
				name, _ := p["name"].(string)
				out = append(out, name)
			}
		}
	}
	return out
}

func oasCheckOperation(t *testing.T, doc map[string]any, rt route, op map[string]any) {
	secV, ok := op["security"]
	if !ok {
		t.Fatalf("no security of its own")
	}
	sec, ok := secV.([]any)
	switch {
	case !ok:
		t.Errorf("security is %v, not a list", secV)
	case rt.public:
		if len(sec) != 0 {
			t.Errorf("public route has security %v", sec)
		}
	case len(sec) != 1:
		t.Errorf("want one security requirement, have %d", len(sec))
	default:
		got := oasSecurity(sec[0])
		want := map[string][]string{"bearer": {string(rt.scope)}}
		if rt.signed {
			want["contentDigest"], want["signatureInput"], want["signature"] = []string{}, []string{}, []string{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("security is %v, want %v", got, want)
		}
		for name := range got {
			if oasDig(doc, "components", "securitySchemes", name) == nil {
				t.Errorf("security scheme %s is not defined", name)
			}
		}
	}
	// Path parameters are exactly the pattern's wildcards.
	item := oasDeref(doc, oasDig(doc, "paths", rt.path))
	params := oasParameters(doc, item, op, "path")
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
	query := oasParameters(doc, item, op, "query")
	if rt.method == http.MethodGet && !rt.public && !slices.Equal(slices.Sorted(slices.Values(query)), slices.Sorted(slices.Values(rt.query))) {
		t.Errorf("query parameters %v, want %v", query, rt.query)
	}
	// Statuses every non-public route can answer.
	codes := oasObject(op, "responses")
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
	if rt.method == http.MethodGet && op["requestBody"] != nil {
		t.Errorf("GET with a request body")
	}
	if rt.method == http.MethodPost && !rt.public && op["requestBody"] == nil {
		t.Errorf("POST without a request body")
	}
	if codes["405"] != nil {
		t.Errorf("405 belongs to the methods a path does not serve, not to an operation")
	}
	ok = false
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
	{"UploadRequest", wire.UploadRequest{}, false},
	{"UploadResponse", wire.UploadResponse{}, true},
	{"UploadPart", wire.UploadPart{}, true},
	{"UploadPartResponse", wire.UploadPartResponse{}, true},
	{"ResumeFrom", wire.ResumeFrom{}, true},
	{"Receipt", receipts.WireReceipt{}, true},
	{"Proof", receipts.Proof{}, true},
	// Operator routes.
	{"DispatchRequest", wire.DispatchRequest{}, false},
	{"DispatchResponse", wire.DispatchResponse{}, true},
	{"DispatchBatchRequest", wire.DispatchBatchRequest{}, false},
	{"DispatchBatchResponse", wire.DispatchBatchResponse{}, true},
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
	{"SafeTypesRequest", wire.SafeTypesRequest{}, false},
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
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	schemas := oasObject(doc, "components", "schemas")
	mapped := map[string]bool{}
	for _, w := range oasWireSchemas {
		mapped[w.schema] = true
		t.Run(w.schema, func(t *testing.T) {
			t.Parallel()
			s := oasDeref(doc, schemas[w.schema])
			if s == nil {
				t.Fatalf("no schema %s", w.schema)
			}
			typ := reflect.TypeOf(w.typ)
			oasCheckStruct(t, doc, w.schema, typ, s, w.response)
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
					if oasDig(s, "properties", name) == nil {
						t.Errorf("%s marshals %q, which the schema lacks", typ, name)
					}
				}
				if w.response {
					for _, name := range oasStrings(s["required"]) {
						if _, ok := m[name]; !ok {
							t.Errorf("%s does not always marshal required %q", typ, name)
						}
					}
				}
			}
		})
	}
	// Every object schema with properties is mapped to a wire type.
	for name, ref := range schemas {
		if len(oasObject(oasDeref(doc, ref), "properties")) > 0 && !mapped[name] {
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

// oasCheckStruct checks schema s against the fields encoding/json
// writes for struct type typ.
func oasCheckStruct(t *testing.T, doc map[string]any, where string, typ reflect.Type, s map[string]any, response bool) {
	t.Helper()
	fields := oasJSONFields(typ)
	props, required := oasObject(s, "properties"), oasStrings(s["required"])
	names := map[string]bool{}
	for _, f := range fields {
		names[f.name] = true
		p := props[f.name]
		if p == nil {
			t.Errorf("%s: field %s.%s (%s) is not a property of the schema", where, typ, f.name, f.typ)
			continue
		}
		oasCheckField(t, doc, where+"."+f.name, f.typ, p, response, slices.Contains(required, f.name), f.omitempty)
		if response && !slices.Contains(required, f.name) && !f.omitempty {
			t.Errorf("%s: %s is always present but not required", where, f.name)
		}
		if response && slices.Contains(required, f.name) && f.omitempty {
			t.Errorf("%s: %s is omitempty but required", where, f.name)
		}
	}
	for name := range props {
		if !names[name] {
			t.Errorf("%s: property %q is no field of %s", where, name, typ)
		}
	}
}

// oasUnwrap returns the schema's types and the schema that carries them
// (as written: a $ref is not followed), seeing through anyOf [X, {type:
// null}].
func oasUnwrap(doc map[string]any, s any) (types []string, inner any) {
	v := oasDeref(doc, s)
	if anyOf, _ := v["anyOf"].([]any); len(anyOf) == 2 {
		for i, alt := range anyOf {
			if slices.Equal(oasTypes(oasDeref(doc, alt)), []string{"null"}) {
				types, inner = oasUnwrap(doc, anyOf[1-i])
				return append(types, "null"), inner
			}
		}
	}
	return oasTypes(v), s
}

// oasCheckField checks the schema of one field of Go type typ. A
// pointer is nullable, except in a request where it tells a required
// field's presence.
//
// A pointer with omitempty is absent, never null: its schema need not be
// nullable, and it may not be required.
func oasCheckField(t *testing.T, doc map[string]any, where string, typ reflect.Type, ref any, response, required, omitempty bool) {
	t.Helper()
	types, inner := oasUnwrap(doc, ref)
	innerRef, _ := oasDig(inner, "$ref").(string)
	innerV := oasDeref(doc, inner)
	nullable := slices.Contains(types, "null")
	if typ.Kind() == reflect.Pointer {
		switch {
		case omitempty && required:
			t.Errorf("%s: %s is omitted when nil but the schema requires it", where, typ)
		case !nullable && !omitempty && (response || !required):
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
		if innerV["format"] != "date-time" {
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
		if enum, _ := innerV["enum"].([]any); typ == oasReceiptKind && len(enum) == 0 {
			t.Errorf("%s: receipt kind without enum", where)
		}
	case typ.Kind() == reflect.Bool:
		is("boolean")
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Uint64:
		is("integer")
	case typ.Kind() == reflect.Map && typ.Key().Kind() == reflect.String && typ.Elem().Kind() == reflect.String:
		is("object")
		if oasDig(innerV, "additionalProperties", "type") != "string" {
			t.Errorf("%s: a map of strings without additionalProperties {type: string}", where)
		}
	case typ.Kind() == reflect.Slice:
		is("array")
		if innerV["items"] == nil {
			t.Errorf("%s: array without items", where)
			return
		}
		oasCheckField(t, doc, where+"[]", typ.Elem(), innerV["items"], response, false, false)
	case typ.Kind() == reflect.Struct:
		if innerRef == "" {
			t.Errorf("%s: struct %s is not a $ref", where, typ)
		}
		is("object")
		// The referenced schema is checked against its own wire type.
		name := strings.TrimPrefix(innerRef, "#/components/schemas/")
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
	t.Parallel()
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
	var raw map[string]any
	if err := json.Unmarshal(openAPIDocument, &raw); err != nil {
		return nil, err
	}
	c := &openAPIChecker{raw: raw, mux: http.NewServeMux(), methods: map[string][]string{},
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
		want = slices.Collect(maps.Keys(oasObject(oasDeref(c.raw, oasDig(c.raw, "paths", pattern)), strings.ToLower(r.Method), "responses")))
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
	t.Parallel()
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
			t.Parallel()
			err := c.check(httptest.NewRequest(tc.method, tc.path, nil), tc.status, tc.header, []byte(tc.body))
			if (err == nil) != tc.ok {
				t.Errorf("check = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
