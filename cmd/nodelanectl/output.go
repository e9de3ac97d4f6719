package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

// outputFormats are the values -o takes, in the order help lists them.
var outputFormats = []string{outTable, outJSON, outYAML, outWide}

// raw reports whether the output is the API's answer itself (-o json or
// -o yaml) rather than a table.
func (a *app) raw() bool { return a.common.output == outJSON || a.common.output == outYAML }

// wide reports whether tables show their extra columns (-o wide).
func (a *app) wide() bool { return a.common.output == outWide }

// printRaw writes an answer of the API, JSON as it came: with -o json as
// it came (safeJSON: no character a terminal acts on), with -o yaml as
// YAML (jsonToYAML).
func (a *app) printRaw(b []byte) error {
	if a.common.output == outYAML {
		y, err := jsonToYAML(b)
		if err != nil {
			return fmt.Errorf("the answer is not JSON: %w", err)
		}
		_, err = a.stdout.Write(y)
		return err
	}
	return a.printJSON(safeJSON(b))
}

// safeJSON returns a JSON text with each character a terminal could act
// on (unsafeRune: C1 controls, DEL, bidirectional formatting) written as
// a \u escape, and each byte that is not UTF-8 as \ufffd: the same JSON
// value, since such characters only occur inside strings (encoding/json
// escapes C0 controls itself, but not those). Outside strings JSON has
// only white space, which is kept.
func safeJSON(b []byte) []byte {
	if utf8.Valid(b) && !bytes.ContainsFunc(b, func(r rune) bool { return unsafeRune(r) && r != '\n' && r != '\t' && r != '\r' }) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			out = append(out, `\ufffd`...)
		case unsafeRune(r) && r != '\n' && r != '\t' && r != '\r':
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// node is a JSON value with its objects' members in the order they came,
// which YAML keeps.
type node struct {
	// kind is one of '{', '[', 's' (string), 'n' (number), 'b' (true or
	// false) and 'z' (null).
	kind  byte
	text  string // a string's, a number's or a boolean's text
	keys  []string
	items []*node // an object's values (by keys) or an array's items
}

// maxDepth bounds the nesting parseJSON accepts (encoding/json's own
// bound is 10,000): an answer of the API is a few levels deep.
const maxDepth = 1000

// errTooDeep is JSON nested deeper than maxDepth.
var errTooDeep = errors.New("nested deeper than 1000 levels")

// parseJSON reads one JSON value, keeping the order of object members.
func parseJSON(b []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	n, err := parseNode(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return n, nil
}

func parseNode(d *json.Decoder, depth int) (*node, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := &node{kind: byte(v)}
		for d.More() {
			if v == '{' {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k.(string))
			}
			item, err := parseNode(d, depth+1)
			if err != nil {
				return nil, err
			}
			n.items = append(n.items, item)
		}
		if _, err := d.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &node{kind: 's', text: v}, nil
	case json.Number:
		return &node{kind: 'n', text: v.String()}, nil
	case bool:
		return &node{kind: 'b', text: strconv.FormatBool(v)}, nil
	case nil:
		return &node{kind: 'z'}, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// jsonToYAML writes a JSON text as a YAML 1.2 document (block style, the
// members of objects in their order) of the same value: numbers, true,
// false and null as they are, strings plain when no YAML reader could
// take them for anything else, else double-quoted with every control
// character escaped.
func jsonToYAML(b []byte) ([]byte, error) {
	n, err := parseJSON(b)
	if err != nil {
		return nil, err
	}
	var w bytes.Buffer
	writeYAML(&w, n, 0, false)
	return w.Bytes(), nil
}

// yamlItem writes a JSON text as one item of a top-level YAML block
// sequence: jobs logs -o yaml writes its events so, one at a time.
func yamlItem(b []byte) ([]byte, error) {
	n, err := parseJSON(b)
	if err != nil {
		return nil, err
	}
	var w bytes.Buffer
	w.WriteString("-")
	writeYAML(&w, n, 1, true)
	return w.Bytes(), nil
}

// writeYAML writes n, which follows a key ("key:") or a sequence entry
// ("-") already written, or starts the document when indent is 0 and
// inline is false; it ends with a newline. indent is the indentation of
// n's members, in steps of two spaces.
func writeYAML(w *bytes.Buffer, n *node, indent int, inline bool) {
	pad := strings.Repeat("  ", indent)
	switch {
	case n.kind == '{' && len(n.items) > 0:
		for i, k := range n.keys {
			w.WriteString(lead(i, inline, pad))
			w.WriteString(yamlString(k))
			w.WriteString(":")
			writeValue(w, n.items[i], indent)
		}
	case n.kind == '[' && len(n.items) > 0:
		for i, item := range n.items {
			w.WriteString(lead(i, inline, pad))
			w.WriteString("-")
			writeYAML(w, item, indent+1, true)
		}
	default:
		if inline {
			w.WriteString(" ")
		}
		w.WriteString(yamlScalar(n))
		w.WriteString("\n")
	}
}

// lead is what comes before the i-th member or item of a collection:
// a space after the "-" or "key:" its first follows on the same line,
// else its indentation.
func lead(i int, inline bool, pad string) string {
	if i == 0 && inline {
		return " "
	}
	return pad
}

// writeValue writes the value of a member after its "key:".
func writeValue(w *bytes.Buffer, n *node, indent int) {
	if (n.kind == '{' || n.kind == '[') && len(n.items) > 0 {
		w.WriteString("\n")
		writeYAML(w, n, indent+1, false)
		return
	}
	w.WriteString(" ")
	w.WriteString(yamlScalar(n))
	w.WriteString("\n")
}

// yamlScalar is a scalar, or an empty object or array, in flow style.
func yamlScalar(n *node) string {
	switch n.kind {
	case '{':
		return "{}"
	case '[':
		return "[]"
	case 's':
		return yamlString(n.text)
	case 'z':
		return "null"
	}
	return n.text
}

// yamlString is s as a YAML scalar: plain when it is a word no YAML
// reader (1.1 or 1.2) would take for a number, a boolean, null, a time
// or syntax, else double-quoted.
func yamlString(s string) string {
	if plainYAML(s) {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			b.WriteString(`\ufffd`)
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case unsafeRune(r) || r == '\u2028' || r == '\u2029' || r == '\uFEFF':
			if r < 0x100 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// yamlReserved are the plain words YAML 1.1 or 1.2 readers take for
// booleans or null.
var yamlReserved = map[string]bool{"y": true, "n": true, "yes": true, "no": true, "on": true, "off": true,
	"true": true, "false": true, "null": true, "~": true}

// plainYAML reports whether s may be written plain: a letter or _ then
// letters, digits, _, -, . and /, and not a reserved word.
func plainYAML(s string) bool {
	if s == "" || yamlReserved[strings.ToLower(s)] {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '_':
		case i > 0 && ('0' <= c && c <= '9' || c == '-' || c == '.' || c == '/'):
		default:
			return false
		}
	}
	return true
}
