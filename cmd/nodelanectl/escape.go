package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A node controls much of what nodelanectl prints (its node_id, name and
// hostname, a job's log lines and messages), and a control plane keeps
// rows from before it refused control characters in names: printed raw,
// an escape sequence in them could clear the screen, retitle the
// terminal or write the clipboard (OSC 52). Every string of a table and
// of jobs logs goes through escapeText; -o json through safeJSON (JSON
// escapes C0 controls itself, but encoding/json leaves DEL, C1 controls
// and bidirectional formatting raw), -o yaml through yamlString.

// escapeText returns s with each character a terminal could act on
// written as a Go escape (\x1b, \u009b, \u202e): C0 controls, DEL, C1
// controls, the bidirectional formatting characters that reorder what
// follows them, and bytes that are not UTF-8. A tab is kept when keepTab.
func escapeText(s string, keepTab bool) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unsafeRune(r) && !(keepTab && r == '\t') }) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case keepTab && r == '\t', !unsafeRune(r):
			b.WriteRune(r)
		case r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// unsafeRune reports whether a terminal may act on r rather than show it.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}
