package command

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// Limits of what a job's process writes.
const (
	// MaxLineBytes bounds one output line; the rest of a longer line is
	// dropped and the line ends with TruncatedMark.
	MaxLineBytes = wire.MaxMessageBytes - 64
	// TruncatedMark ends a line cut at MaxLineBytes.
	TruncatedMark = " ...(truncated)"
	// DefaultLineRate and DefaultLineBurst bound the output lines per
	// second a job logs (a token bucket shared by stdout and stderr);
	// lines beyond are dropped and counted.
	DefaultLineRate  = 100
	DefaultLineBurst = 1000
	// MaxArtifacts bounds the artifacts one run reports.
	MaxArtifacts = 1000
)

// Prefixes of the stdout lines that are not log lines.
const (
	ProgressPrefix = "nodelane:progress"
	ArtifactPrefix = "nodelane:artifact"
)

// Progress is a nodelane:progress line's JSON.
type Progress struct {
	// Fraction done, 0 to 1; nil if not given.
	Fraction *float64 `json:"fraction"`
	// Message is the status event's message.
	Message string `json:"message"`
	// Metrics, a JSON object, goes into the event's payload.
	Metrics json.RawMessage `json:"metrics"`
}

// Artifact is a nodelane:artifact line's JSON.
type Artifact struct {
	// Name defaults to the base name of Path.
	Name string `json:"name"`
	// Path is relative to NODELANE_OUTPUT_DIR and stays inside it.
	Path string `json:"path"`
	// Kind is the artifact_type; defaults to "file".
	Kind string `json:"kind"`
	// Metadata, a JSON object, is kept with the artifact.
	Metadata json.RawMessage `json:"metadata"`
}

// ParseLine says what a stdout line is: a progress report (p), an
// artifact report (a), or a log line (both nil, err nil). A line with
// either prefix whose JSON is not valid gives an error, and the caller
// logs it as a plain line with a warning.
func ParseLine(line string) (p *Progress, a *Artifact, err error) {
	switch {
	case hasPrefix(line, ProgressPrefix):
		p = &Progress{}
		if err := strictJSON(line[len(ProgressPrefix):], p); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ProgressPrefix, err)
		}
		if p.Fraction != nil && (math.IsNaN(*p.Fraction) || *p.Fraction < 0 || *p.Fraction > 1) {
			return nil, nil, fmt.Errorf("%s: fraction %v is not between 0 and 1", ProgressPrefix, *p.Fraction)
		}
		if err := object("metrics", p.Metrics); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ProgressPrefix, err)
		}
		return p, nil, nil
	case hasPrefix(line, ArtifactPrefix):
		a = &Artifact{}
		if err := strictJSON(line[len(ArtifactPrefix):], a); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ArtifactPrefix, err)
		}
		if a.Path == "" {
			return nil, nil, fmt.Errorf("%s: path is required", ArtifactPrefix)
		}
		if !filepath.IsLocal(a.Path) {
			return nil, nil, fmt.Errorf("%s: path %q is not a relative path inside NODELANE_OUTPUT_DIR", ArtifactPrefix, a.Path)
		}
		if a.Name == "" {
			a.Name = filepath.Base(a.Path)
		}
		if a.Kind == "" {
			a.Kind = "file"
		}
		if len(a.Name) > wire.MaxNameBytes || len(a.Kind) > wire.MaxNameBytes {
			return nil, nil, fmt.Errorf("%s: name and kind are at most %d bytes", ArtifactPrefix, wire.MaxNameBytes)
		}
		if err := object("metadata", a.Metadata); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ArtifactPrefix, err)
		}
		return nil, a, nil
	}
	return nil, nil, nil
}

// hasPrefix reports whether line starts with prefix followed by a blank
// or the end (so "nodelane:progressbar" is a log line).
func hasPrefix(line, prefix string) bool {
	if !strings.HasPrefix(line, prefix) {
		return false
	}
	rest := line[len(prefix):]
	return rest == "" || rest[0] == ' ' || rest[0] == '\t'
}

func strictJSON(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("bad JSON: text after the object")
	}
	return nil
}

// object checks an optional JSON object field.
func object(name string, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if len(raw) > wire.MaxPayloadBytes {
		return fmt.Errorf("%s is over %d bytes", name, wire.MaxPayloadBytes)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		return fmt.Errorf("%s is not a JSON object", name)
	}
	return nil
}

// readLines calls fn with each line of r (without its line end), cut at
// limit bytes (then truncated is true), until r ends. It reads continuously
// whatever fn does with the lines, as long as fn does not block.
func readLines(r io.Reader, limit int, fn func(line string, truncated bool)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	truncated := false
	for {
		chunk, err := br.ReadSlice('\n')
		if room := limit - len(buf); len(chunk) > room {
			if room > 0 {
				buf = append(buf, chunk[:room]...)
			}
			truncated = truncated || len(bytes.TrimRight(chunk[max(room, 0):], "\r\n")) > 0
		} else {
			buf = append(buf, chunk...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if len(buf) > 0 || err == nil {
			line := strings.TrimRight(string(buf), "\r\n")
			if truncated {
				line = strings.ToValidUTF8(trimRune(line), "\uFFFD")
			}
			fn(line, truncated)
			buf, truncated = buf[:0], false
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// trimRune drops a rune the cut split at the end of s.
func trimRune(s string) string {
	for i := 0; i < utf8.UTFMax && len(s) > 0; i++ {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// bucket is a token bucket of lines.
type bucket struct {
	now   func() time.Time
	rate  float64
	burst float64

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int64
}

func newBucket(rate float64, burst int, now func() time.Time) *bucket {
	return &bucket{now: now, rate: rate, burst: float64(burst), tokens: float64(burst), last: now()}
}

// take reports whether a line may be logged; if so, dropped is how many
// lines were dropped since the last line logged.
func (b *bucket) take() (ok bool, dropped int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.tokens = math.Min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		b.dropped++
		return false, 0
	}
	b.tokens--
	dropped, b.dropped = b.dropped, 0
	return true, dropped
}

// flush returns, and forgets, the lines dropped since the last logged.
func (b *bucket) flush() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.dropped
	b.dropped = 0
	return d
}
