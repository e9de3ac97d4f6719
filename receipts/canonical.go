package receipts

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxInt is the largest integer a canonical body holds, 2^53-1: every
// JSON implementation, JavaScript's included, reads it exactly.
const MaxInt = 1<<53 - 1

// MaxBodySize caps the canonical bytes of one receipt.
const MaxBodySize = 64 << 10

// member is one member of a flat canonical object: a string, or a
// non-negative integer when isInt.
type member struct {
	key   string
	isInt bool
	str   string
	num   int64
}

// appendObject writes members as a canonical object. The keys must be
// distinct; they are sorted here.
func appendObject(b []byte, ms []member) []byte {
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.key, b.key) })
	b = append(b, '{')
	for i, m := range ms {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m.key)
		b = append(b, ':')
		if m.isInt {
			b = strconv.AppendInt(b, m.num, 10)
		} else {
			b = appendString(b, m.str)
		}
	}
	return append(b, '}')
}

// appendString writes s, which must be valid UTF-8, as RFC 8785 does:
// only '"', '\\' and the C0 controls are escaped, the controls that have
// a short form with it and the rest as \u00xx in lowercase hex.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// parseObject reads a flat JSON object of strings and non-negative
// integers. It rejects, with a message that says which, whitespace, any
// other kind of value, integers that are negative, fractional, in
// exponent form, with leading zeros or above MaxInt, invalid UTF-8, and
// duplicate keys. It accepts any JSON string escape: whether the escapes
// are the canonical ones is for the caller's re-encoding to tell.
func parseObject(b []byte) ([]member, error) {
	p := parser{b: b}
	if !p.eat('{') {
		return nil, p.errorf("the body is not a JSON object")
	}
	var ms []member
	seen := map[string]bool{}
	if p.eat('}') {
		return ms, p.end()
	}
	for {
		if p.peek() != '"' {
			return nil, p.errorf("expected a key")
		}
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, p.errorf("duplicate key %q", key)
		}
		seen[key] = true
		if !p.eat(':') {
			return nil, p.errorf("expected ':' after %q", key)
		}
		m := member{key: key}
		switch c := p.peek(); {
		case c == '"':
			if m.str, err = p.str(); err != nil {
				return nil, err
			}
		case c >= '0' && c <= '9':
			if m.num, err = p.uint(key); err != nil {
				return nil, err
			}
			m.isInt = true
		case c == '-':
			return nil, p.errorf("%q is negative", key)
		case c == 't' || c == 'f':
			return nil, p.errorf("%q is a boolean", key)
		case c == 'n':
			return nil, p.errorf("%q is null", key)
		case c == '[':
			return nil, p.errorf("%q is an array", key)
		case c == '{':
			return nil, p.errorf("%q is a nested object", key)
		default:
			return nil, p.errorf("%q has no valid value", key)
		}
		ms = append(ms, m)
		if p.eat('}') {
			return ms, p.end()
		}
		if !p.eat(',') {
			return nil, p.errorf("expected ',' or '}' after %q", key)
		}
	}
}

type parser struct {
	b []byte
	i int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrNotCanonical, p.i, fmt.Sprintf(format, args...))
}

func (p *parser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *parser) eat(c byte) bool {
	if p.peek() == c && p.i < len(p.b) {
		p.i++
		return true
	}
	return false
}

func (p *parser) end() error {
	if p.i != len(p.b) {
		return p.errorf("bytes after the object")
	}
	return nil
}

func (p *parser) uint(key string) (int64, error) {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	digits := string(p.b[start:p.i])
	switch p.peek() {
	case '.':
		return 0, p.errorf("%q is not an integer", key)
	case 'e', 'E':
		return 0, p.errorf("%q is in exponent form", key)
	}
	if len(digits) > 1 && digits[0] == '0' {
		return 0, p.errorf("%q has a leading zero", key)
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n > MaxInt {
		return 0, p.errorf("%q is above 2^53-1", key)
	}
	return n, nil
}

func (p *parser) str() (string, error) {
	p.i++ // the opening quote
	var sb strings.Builder
	for {
		if p.i >= len(p.b) {
			return "", p.errorf("unterminated string")
		}
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return sb.String(), nil
		case c < 0x20:
			return "", p.errorf("unescaped control character in a string")
		case c == '\\':
			if err := p.escape(&sb); err != nil {
				return "", err
			}
		case c < utf8.RuneSelf:
			sb.WriteByte(c)
			p.i++
		default:
			r, n := utf8.DecodeRune(p.b[p.i:])
			if r == utf8.RuneError && n == 1 {
				return "", p.errorf("invalid UTF-8")
			}
			sb.Write(p.b[p.i : p.i+n])
			p.i += n
		}
	}
}

func (p *parser) escape(sb *strings.Builder) error {
	if p.i+1 >= len(p.b) {
		return p.errorf("unterminated escape")
	}
	c := p.b[p.i+1]
	p.i += 2
	switch c {
	case '"', '\\', '/':
		sb.WriteByte(c)
	case 'b':
		sb.WriteByte('\b')
	case 'f':
		sb.WriteByte('\f')
	case 'n':
		sb.WriteByte('\n')
	case 'r':
		sb.WriteByte('\r')
	case 't':
		sb.WriteByte('\t')
	case 'u':
		r, ok := p.hex4()
		if !ok {
			return p.errorf("malformed \\u escape")
		}
		if utf16.IsSurrogate(r) {
			// Only a high surrogate followed by an escaped low one makes a
			// code point; a lone surrogate is not valid UTF-8.
			if r >= 0xdc00 || p.peek() != '\\' || p.i+1 >= len(p.b) || p.b[p.i+1] != 'u' {
				return p.errorf("lone surrogate in a string")
			}
			p.i += 2
			r2, ok := p.hex4()
			if !ok {
				return p.errorf("malformed \\u escape")
			}
			if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
				return p.errorf("lone surrogate in a string")
			}
		}
		sb.WriteRune(r)
	default:
		return p.errorf("unknown escape \\%c", c)
	}
	return nil
}

func (p *parser) hex4() (rune, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.b[p.i:p.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(n), true
}
