package replay

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dunglas/httpsfv"
)

// parseDictionary parses the field lines of a dictionary field (RFC 8941
// §3.2) after checking, on the raw text, that no member and no parameter
// list names a key twice: httpsfv, like every parser that follows the
// RFC, keeps only the last of them, and a signature must not mean one
// thing to one parser and another to the next. Lines are combined as
// HTTP combines them, so two lines that define one label are duplicates.
func parseDictionary(lines []string) (*httpsfv.Dictionary, error) {
	field := strings.Join(lines, ", ")
	d, err := httpsfv.UnmarshalDictionary([]string{field})
	if err != nil {
		return nil, err
	}
	// The scanner runs on text httpsfv accepted, so it only needs to find
	// where keys are.
	if err := checkDuplicates(field); err != nil {
		return nil, err
	}
	return d, nil
}

// checkDuplicates reports a key that occurs twice among the members of the
// dictionary field s, or among the parameters of any one item or inner
// list in it. s must be a dictionary that httpsfv accepts; for other text
// it may report an error or nothing, but it always returns.
func checkDuplicates(s string) error {
	sc := rawScanner{s: s}
	_, err := sc.dictionary()
	return err
}

// rawScanner walks the syntax of RFC 8941 (as extended by RFC 9651),
// recording keys and skipping values.
type rawScanner struct {
	s string
	i int
	// params counts the parameters seen, for the fuzz test to compare
	// with the parser's.
	nparams int
}

var errRawSyntax = errors.New("invalid structured field")

func (sc *rawScanner) eof() bool { return sc.i >= len(sc.s) }

func (sc *rawScanner) at(c byte) bool { return sc.i < len(sc.s) && sc.s[sc.i] == c }

func (sc *rawScanner) skipSP() {
	for sc.at(' ') {
		sc.i++
	}
}

func (sc *rawScanner) skipOWS() {
	for sc.at(' ') || sc.at('\t') {
		sc.i++
	}
}

// keySet records keys to find one named twice in time linear in their
// number: a field of n members must not cost n² comparisons (a 900 KB
// Content-Digest once did). A short list is scanned, which is cheapest
// for the few keys a signature has; past smallKeys the keys move to a map.
type keySet struct {
	small []string
	big   map[string]struct{}
}

// smallKeys is how many keys a keySet scans before it uses a map.
const smallKeys = 8

// add records k and reports whether it was new.
func (s *keySet) add(k string) bool {
	if s.big != nil {
		if _, ok := s.big[k]; ok {
			return false
		}
		s.big[k] = struct{}{}
		return true
	}
	for _, o := range s.small {
		if o == k {
			return false
		}
	}
	if len(s.small) < smallKeys {
		s.small = append(s.small, k)
		return true
	}
	s.big = make(map[string]struct{}, 2*smallKeys)
	for _, o := range s.small {
		s.big[o] = struct{}{}
	}
	s.big[k] = struct{}{}
	s.small = nil
	return true
}

// dictionary returns the member keys in order.
func (sc *rawScanner) dictionary() ([]string, error) {
	var (
		keys []string
		seen keySet
	)
	sc.skipSP()
	for !sc.eof() {
		k, err := sc.key()
		if err != nil {
			return nil, err
		}
		if !seen.add(k) {
			return nil, fmt.Errorf("duplicate member %q", k)
		}
		keys = append(keys, k)
		if sc.at('=') {
			sc.i++
			if sc.at('(') {
				err = sc.innerList()
			} else {
				err = sc.bareItem()
			}
			if err != nil {
				return nil, err
			}
		}
		if err := sc.params(); err != nil {
			return nil, err
		}
		sc.skipOWS()
		if sc.eof() {
			break
		}
		if !sc.at(',') {
			return nil, errRawSyntax
		}
		sc.i++
		sc.skipOWS()
	}
	return keys, nil
}

func (sc *rawScanner) key() (string, error) {
	start := sc.i
	if sc.eof() || !(isLCAlpha(sc.s[sc.i]) || sc.s[sc.i] == '*') {
		return "", errRawSyntax
	}
	for sc.i++; !sc.eof() && isKeyChar(sc.s[sc.i]); sc.i++ {
	}
	return sc.s[start:sc.i], nil
}

func (sc *rawScanner) params() error {
	var seen keySet
	for sc.at(';') {
		sc.i++
		sc.skipSP()
		k, err := sc.key()
		if err != nil {
			return err
		}
		if !seen.add(k) {
			return fmt.Errorf("duplicate parameter %q", k)
		}
		sc.nparams++
		if sc.at('=') {
			sc.i++
			if err := sc.bareItem(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (sc *rawScanner) innerList() error {
	sc.i++ // '('
	for {
		sc.skipSP()
		if sc.eof() {
			return errRawSyntax
		}
		if sc.at(')') {
			sc.i++
			return sc.params()
		}
		if err := sc.bareItem(); err != nil {
			return err
		}
		if err := sc.params(); err != nil {
			return err
		}
	}
}

// bareItem skips one bare item. Each branch consumes at least one byte or
// fails, so the loops above terminate.
func (sc *rawScanner) bareItem() error {
	if sc.eof() {
		return errRawSyntax
	}
	c := sc.s[sc.i]
	switch {
	case c == '"':
		for sc.i++; !sc.eof(); sc.i++ {
			switch sc.s[sc.i] {
			case '\\':
				sc.i++
			case '"':
				sc.i++
				return nil
			}
		}
		return errRawSyntax
	case c == '%': // display string: %"...", with %xx escapes only
		sc.i++
		if !sc.at('"') {
			return errRawSyntax
		}
		j := strings.IndexByte(sc.s[sc.i+1:], '"')
		if j < 0 {
			return errRawSyntax
		}
		sc.i += j + 2
		return nil
	case c == ':':
		j := strings.IndexByte(sc.s[sc.i+1:], ':')
		if j < 0 {
			return errRawSyntax
		}
		sc.i += j + 2
		return nil
	case c == '?':
		sc.i += 2
		return nil
	case c == '@' || c == '-' || isDigit(c):
		for sc.i++; !sc.eof() && (isDigit(sc.s[sc.i]) || sc.s[sc.i] == '.' || sc.s[sc.i] == '-'); sc.i++ {
		}
		return nil
	case c == '*' || isAlpha(c):
		for sc.i++; !sc.eof() && isTokenChar(sc.s[sc.i]); sc.i++ {
		}
		return nil
	}
	return errRawSyntax
}

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool   { return '0' <= c && c <= '9' }

func isKeyChar(c byte) bool {
	return isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

// isTokenChar reports whether c may follow the first character of a
// token: tchar, ':' or '/'.
func isTokenChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

// validKey reports whether k is an RFC 8941 key.
func validKey(k string) bool {
	if k == "" || !(isLCAlpha(k[0]) || k[0] == '*') {
		return false
	}
	for i := 1; i < len(k); i++ {
		if !isKeyChar(k[i]) {
			return false
		}
	}
	return true
}

// appendString appends s serialised as an RFC 8941 string.
func appendString(b []byte, s string) ([]byte, error) {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			return nil, fmt.Errorf("string %q has a byte outside printable ASCII", s)
		}
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return append(b, '"'), nil
}

// maxInteger is the largest magnitude of an RFC 8941 integer.
const maxInteger = 999_999_999_999_999
