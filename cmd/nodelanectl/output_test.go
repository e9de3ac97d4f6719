package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestJSONToYAML checks the YAML of JSON values against the expected text
// and, read back by a YAML library (a test-only dependency), against the
// JSON value itself: every string stays a string, control characters
// escaped.
func TestJSONToYAML(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`{"a":1,"b":"x"}`, "a: 1\nb: x\n"},
		{`{"z":1,"a":2}`, "z: 1\na: 2\n"},
		{`[]`, "[]\n"},
		{`{}`, "{}\n"},
		{`"plain"`, "plain\n"},
		{`null`, "null\n"},
		{`{"jobs":[{"id":"job_1","tags":[]},{"id":"job_2","n":null}],"next":"job_2"}`,
			"jobs:\n  - id: job_1\n    tags: []\n  - id: job_2\n    \"n\": null\n" + "next: job_2\n"},
		{`[[1,2],[3]]`, "- - 1\n  - 2\n- - 3\n"},
		{`{"a":{"b":{"c":true}}}`, "a:\n  b:\n    c: true\n"},
		{`[{"a":{"b":1},"c":[1]}]`, "- a:\n    b: 1\n  c:\n    - 1\n"},
		{`{"s":"yes","t":"No","u":"1.5","v":"2026-12-01T00:00:00Z","w":"","x":"a: b","y":"-1","z":"~"}`,
			"s: \"yes\"\nt: \"No\"\nu: \"1.5\"\nv: \"2026-12-01T00:00:00Z\"\nw: \"\"\nx: \"a: b\"\n\"y\": \"-1\"\nz: \"~\"\n"},
		{`{"m":"a\u001b]52;c;x\u0007b\u009b\u202e\n\t\"\\"}`, `m: "a\x1b]52;c;x\x07b\x9b\u202e\n\t\"\\"` + "\n"},
		{`{"key with space":1.5e3}`, "\"key with space\": 1.5e3\n"},
	} {
		got, err := jsonToYAML([]byte(c.in))
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("%s:\ngot\n%s\nwant\n%s", c.in, got, c.want)
		}
		var fromJSON, fromYAML any
		if err := json.Unmarshal([]byte(c.in), &fromJSON); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(got, &fromYAML); err != nil {
			t.Errorf("%s: the YAML does not read back: %v\n%s", c.in, err, got)
			continue
		}
		if !reflect.DeepEqual(normalize(fromJSON), normalize(fromYAML)) {
			t.Errorf("%s: the YAML reads back as %#v, not %#v", c.in, fromYAML, fromJSON)
		}
		for _, r := range string(got) {
			if unsafeRune(r) && r != '\n' {
				t.Errorf("%s: the YAML holds %U", c.in, r)
			}
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1}{}`, `[1,]`, strings.Repeat("[", 1002) + strings.Repeat("]", 1002)} {
		if _, err := jsonToYAML([]byte(bad)); err == nil {
			t.Errorf("%.20q: no error", bad)
		}
	}
}

// normalize makes the numbers of a decoded value float64 and its maps
// map[string]any, so that a JSON and a YAML decoding compare.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, v := range x {
			m[k] = normalize(v)
		}
		return m
	case []any:
		for i := range x {
			x[i] = normalize(x[i])
		}
		return x
	case int:
		return float64(x)
	case uint64:
		return float64(x)
	case int64:
		return float64(x)
	}
	return v
}

// TestSafeJSON checks that -o json escapes what encoding/json leaves raw
// (DEL, C1 controls, bidirectional formatting, bytes that are not UTF-8)
// and that the value stays the same.
func TestSafeJSON(t *testing.T) {
	t.Parallel()
	in := []byte("{\"m\": \"a\x7fb\u009b31m\u202ec\xffd\u00e9\"}\n")
	got := safeJSON(in)
	if want := "{\"m\": \"a\\u007fb\\u009b31m\\u202ec\\ufffdd\u00e9\"}\n"; string(got) != want {
		t.Errorf("safeJSON:\ngot  %q\nwant %q", got, want)
	}
	var a, b map[string]string
	if err := json.Unmarshal(in, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &b); err != nil || a["m"] != b["m"] {
		t.Errorf("the value changed: %q → %q (%v)", a["m"], b["m"], err)
	}
	plain := []byte(`{"ok": "é ✓"}`)
	if got := safeJSON(plain); &got[0] != &plain[0] {
		t.Errorf("a safe answer was copied")
	}
}

// TestExitCode checks the exit status of each kind of failure.
func TestExitCode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	// A port nothing listens on: a real connection refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, refused := http.Get("http://" + addr + "/")
	if refused == nil {
		t.Fatal("a closed port answered")
	}
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want int
	}{
		{ctx, nil, exitOK},
		{ctx, usagef("bad"), exitUsage},
		{ctx, fmt.Errorf("x: %w", errNoToken), exitAuth},
		{ctx, &wire.Error{Status: 401}, exitAuth},
		{ctx, fmt.Errorf("op: %w", &wire.Error{Status: 403}), exitAuth},
		{ctx, &wire.Error{Status: 404}, exitNotFound},
		{ctx, &wire.Error{Status: 409}, exitFail},
		{ctx, &wire.Error{Status: 400}, exitFail},
		{ctx, &wire.Error{Status: 500}, exitUnavailable},
		{ctx, &wire.Error{Status: 503}, exitUnavailable},
		{ctx, &wire.Error{Status: 429}, exitUnavailable},
		{ctx, fmt.Errorf("operator: GET /x: %w", refused), exitUnavailable},
		{ctx, &net.DNSError{Err: "no such host", Name: "nowhere.invalid"}, exitUnavailable},
		{ctx, context.DeadlineExceeded, exitUnavailable},
		{ctx, &jobEndError{ID: "job_1", State: "failed"}, exitJobFailed},
		{ctx, fmt.Errorf("w: %w", &jobEndError{ID: "job_1", State: "canceled"}), exitJobCanceled},
		{ctx, errWaitTimeout, exitWaitTimeout},
		{canceled, context.Canceled, exitInterrupted},
		{ctx, errInvalid, exitFail},
		{ctx, errors.New("anything else"), exitFail},
	} {
		if got := exitCode(c.ctx, c.err); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
