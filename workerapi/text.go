package workerapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Characters a request may carry (PROTOCOL.md §5.14), checked as a body
// is decoded and, for the path and the query, before it is read, so that
// no store is asked to keep a character it cannot hold (PostgreSQL text
// holds no NUL) and nothing a node names (its node_id, a job type, a
// tag) can hold a terminal escape. Each refusal is 400 invalid_request
// naming the field, never echoing the character.
//
//   - Free text (the fields named in freeText: messages, log lines,
//     reasons) holds any character but NUL: a log line is a job's output
//     as printed, tabs, carriage returns and colour escapes included, and
//     whoever shows it escapes it.
//   - A JSON object kept as sent (payload, metadata, metrics) holds no
//     NUL (\u0000) in a string or a member name.
//   - Every other string (ids, types, names, hostnames, tags, URIs,
//     tokens, keys), the path and the query hold no control character:
//     C0 (NUL included), DEL or C1 (unicode.IsControl).

// freeText are the JSON names of the fields that hold free text.
var freeText = []string{"message", "final_message", "reason"}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// checkChars checks every string of the decoded body v, named by its
// JSON path (capabilities.gpus[0].sku, entries[3].message,
// payload.a[1]).
func checkChars(v any) error {
	return walkChars("", "", reflect.ValueOf(v))
}

// walkChars checks v, found at path; name is the JSON name of the field
// that holds it (the last one for an array's element).
func walkChars(path, name string, v reflect.Value) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return walkChars(path, name, v.Elem())
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || tag == "-" {
				continue
			}
			if f.Anonymous && tag == "" {
				// An embedded struct's fields are its holder's (Completion).
				if err := walkChars(path, name, v.Field(i)); err != nil {
					return err
				}
				continue
			}
			if tag == "" {
				tag = f.Name
			}
			if err := walkChars(joinPath(path, tag), tag, v.Field(i)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type() == rawMessageType {
			return checkJSONChars(path, v.Bytes())
		}
		for i := range v.Len() {
			if err := walkChars(fmt.Sprintf("%s[%d]", path, i), name, v.Index(i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			if k.Kind() == reflect.String && strings.ContainsFunc(k.String(), unicode.IsControl) {
				return invalid("%s holds a member name with a control character", orBody(path))
			}
			if err := walkChars(keyPath(path, k.String()), name, v.MapIndex(k)); err != nil {
				return err
			}
		}
	case reflect.String:
		s := v.String()
		if slices.Contains(freeText, name) {
			if i := strings.IndexByte(s, 0); i >= 0 {
				return invalid("%s holds NUL at byte %d: text may hold any character but NUL", path, i)
			}
			return nil
		}
		if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
			return invalid("%s holds the control character %U at byte %d", path, []rune(s[i:])[0], i)
		}
	}
	return nil
}

// nulEscape is how JSON text spells NUL in a string (a raw NUL byte is
// malformed JSON, which decoding refuses).
var nulEscape = []byte(`\u0000`)

// checkJSONChars refuses a JSON value kept as sent whose strings or
// member names hold NUL, naming the first such string's path.
func checkJSONChars(path string, raw json.RawMessage) error {
	if !bytes.Contains(raw, nulEscape) {
		return nil // the common case; `\\u0000` (no NUL) is looked at below
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil // decoding has checked it is JSON
	}
	return walkJSON(path, v)
}

func walkJSON(path string, v any) error {
	switch v := v.(type) {
	case string:
		if i := strings.IndexByte(v, 0); i >= 0 {
			return invalid("%s holds NUL (\\u0000) at byte %d", path, i)
		}
	case []any:
		for i, e := range v {
			if err := walkJSON(fmt.Sprintf("%s[%d]", path, i), e); err != nil {
				return err
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if strings.IndexByte(k, 0) >= 0 {
				return invalid("%s holds a member name with NUL (\\u0000)", path)
			}
			if err := walkJSON(keyPath(path, k), v[k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRequestChars refuses a control character in the request's path
// (its ids, once percent-decoded) or query.
func checkRequestChars(r *http.Request) error {
	if strings.ContainsFunc(r.URL.Path, unicode.IsControl) {
		return invalid("the path holds a control character")
	}
	for name, vs := range r.URL.Query() {
		if strings.ContainsFunc(name, unicode.IsControl) {
			return invalid("query parameter %q: its name holds a control character", name)
		}
		for _, v := range vs {
			if strings.ContainsFunc(v, unicode.IsControl) {
				return invalid("query parameter %q holds a control character", name)
			}
		}
	}
	return nil
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// keyPath names a member of the object at path: a.b, or a["b c"] when the
// name is not a plain word.
func keyPath(path, key string) string {
	if key != "" && strings.Trim(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == "" {
		return joinPath(path, key)
	}
	return path + "[" + strconv.Quote(key) + "]"
}

func orBody(path string) string {
	if path == "" {
		return "the body"
	}
	return path
}
