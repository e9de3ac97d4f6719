package wire

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CheckTag returns nil if tag may be a tag, or says why not: a tag is 1
// to MaxTagBytes bytes of UTF-8 without whitespace or control
// characters. It is the one rule of the tags of register and start and
// of a job's requirements.tags, so that a node registers only tags a job
// can ask for; a worker checks its own with it before it registers.
func CheckTag(tag string) error {
	if tag == "" || len(tag) > MaxTagBytes || !utf8.ValidString(tag) {
		return fmt.Errorf("must be 1 to %d bytes of UTF-8", MaxTagBytes)
	}
	if strings.ContainsFunc(tag, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return errors.New("must hold no whitespace or control character")
	}
	return nil
}
