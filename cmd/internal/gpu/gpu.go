// Package gpu finds a worker's NVIDIA GPUs and samples their use, by
// running nvidia-smi, for cmd/worker: Discover lists the GPUs once
// at start (the registration's capabilities.gpus, see SKU), and a
// Sampler keeps a recent per-GPU sample of utilisation, memory and
// temperature for the heartbeat's metrics (Metrics).
//
// nvidia-smi is run as
//
//	nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits
//
// with a time limit (DefaultTimeout) and a bound on what it may write
// (MaxOutputBytes); its answer must list at most MaxDevices GPUs, one
// line each with exactly the fields asked for. A value nvidia-smi cannot
// give ("[N/A]", "[Not Supported]", any other "[...]", "N/A") counts as
// absent. Anything else it writes is refused with an error that names
// the line (*ParseError). When there is no nvidia-smi, the error wraps
// ErrNoNvidiaSMI.
package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// The bounds on one run of nvidia-smi.
const (
	// DefaultTimeout bounds one run of nvidia-smi, which can hang on a
	// wedged driver.
	DefaultTimeout = 10 * time.Second
	// MaxOutputBytes bounds what one run may write on its standard
	// output: far above what MaxDevices lines take.
	MaxOutputBytes = 256 << 10
	// MaxDevices bounds the GPUs one answer may list: the GPUs a
	// registration may carry (wire.MaxGPUs).
	MaxDevices = wire.MaxGPUs
	// MaxUUIDBytes bounds a GPU's UUID ("GPU-" and 36 characters in
	// practice), which holds only letters, digits and "-_./".
	MaxUUIDBytes = 64
)

// ErrNoNvidiaSMI is wrapped by the error of a run when there is no
// nvidia-smi to run: none on PATH, or none at the path given.
var ErrNoNvidiaSMI = errors.New("no nvidia-smi")

// ErrOutputTooLarge is wrapped by the error of a run whose output went
// over MaxOutputBytes.
var ErrOutputTooLarge = errors.New("nvidia-smi output too large")

// ParseError is an answer of nvidia-smi that is not what was asked for.
type ParseError struct {
	// Line is the line's number, from 1; 0 when the error is about the
	// whole answer.
	Line int
	// Text is the line, cut to 100 bytes.
	Text string
	// Msg says what is wrong with it.
	Msg string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return "nvidia-smi answer: " + e.Msg
	}
	return fmt.Sprintf("nvidia-smi answer, line %d (%q): %s", e.Line, e.Text, e.Msg)
}

// Device is one GPU as nvidia-smi lists it.
type Device struct {
	// Index is nvidia-smi's index of the GPU (PCI bus order).
	Index int
	// UUID is the GPU's UUID ("GPU-..."); CUDA_VISIBLE_DEVICES accepts
	// it, whatever CUDA_DEVICE_ORDER says.
	UUID string
	// Name is the product name ("NVIDIA GeForce RTX 4090"), "" when
	// nvidia-smi cannot tell.
	Name string
	// MemoryMB is the total memory in MiB, 0 when nvidia-smi cannot tell.
	MemoryMB int
}

// GPU is the device as a registration carries it: its SKU (SKU of its
// name) and its VRAM.
func (d Device) GPU() wire.GPU {
	return wire.GPU{SKU: SKU(d.Name), VRAMMB: d.MemoryMB}
}

// GPUs is the registration's capabilities.gpus for devices, in their
// order.
func GPUs(devices []Device) []wire.GPU {
	out := make([]wire.GPU, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.GPU())
	}
	return out
}

// discoverFields are the fields Discover asks for, in order.
var discoverFields = []string{"index", "uuid", "name", "memory.total"}

// Discover lists the GPUs nvidia-smi reports, in its order, running the
// nvidia-smi at path ("" looks "nvidia-smi" up on PATH) within
// DefaultTimeout (and ctx). An empty list means nvidia-smi ran and
// listed none. Every line must give an index and a UUID, each listed
// once; a name or memory.total nvidia-smi cannot give is "" or 0.
func Discover(ctx context.Context, path string) ([]Device, error) {
	return discover(ctx, path, DefaultTimeout)
}

func discover(ctx context.Context, path string, timeout time.Duration) ([]Device, error) {
	lines, err := query(ctx, path, timeout, discoverFields)
	if err != nil {
		return nil, err
	}
	out := make([]Device, 0, len(lines))
	seen := newSeen()
	for _, l := range lines {
		d := Device{Name: l.field(2)}
		var ok bool
		if d.Index, d.UUID, ok = l.id(seen); !ok {
			return nil, l.err
		}
		if d.MemoryMB, ok = l.number(3, "memory.total"); !ok {
			return nil, l.err
		}
		out = append(out, d)
	}
	return out, nil
}

// line is one parsed line of an answer; its first error is kept in err.
type line struct {
	n      int
	text   string
	fields []string
	err    *ParseError
}

func (l *line) fail(format string, args ...any) {
	if l.err == nil {
		l.err = &ParseError{Line: l.n, Text: l.text, Msg: fmt.Sprintf(format, args...)}
	}
}

// field is field i, "" when nvidia-smi could not give it.
func (l *line) field(i int) string {
	v := l.fields[i]
	if v == "N/A" || strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") {
		return ""
	}
	return v
}

// number is field i as a whole number from 0 to MaxInt32, 0 when absent;
// a fraction is rounded.
func (l *line) number(i int, name string) (int, bool) {
	v := l.field(i)
	if v == "" {
		return 0, true
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > math.MaxInt32 {
		l.fail("%s %q is not a number from 0 to %d", name, v, math.MaxInt32)
		return 0, false
	}
	return int(math.Round(f)), true
}

// seen records the indices and UUIDs of an answer.
type seen struct {
	index map[int]bool
	uuid  map[string]bool
}

func newSeen() *seen { return &seen{index: map[int]bool{}, uuid: map[string]bool{}} }

// id parses the index (field 0) and UUID (field 1) of a line, each
// required and listed once in an answer.
func (l *line) id(s *seen) (int, string, bool) {
	v := l.field(0)
	index, err := strconv.Atoi(v)
	switch {
	case err != nil || index < 0 || index > math.MaxInt32:
		l.fail("index %q is not a number from 0 to %d", v, math.MaxInt32)
	case s.index[index]:
		l.fail("index %d is listed twice", index)
	}
	uuid := l.field(1)
	switch {
	case uuid == "":
		l.fail("no uuid")
	case len(uuid) > MaxUUIDBytes:
		l.fail("uuid is over %d bytes", MaxUUIDBytes)
	case strings.ContainsFunc(uuid, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./", r))
	}):
		l.fail("uuid %q holds a character other than a letter, a digit or -_./", uuid)
	case s.uuid[uuid]:
		l.fail("uuid %s is listed twice", uuid)
	}
	if l.err != nil {
		return 0, "", false
	}
	s.index[index], s.uuid[uuid] = true, true
	return index, uuid, true
}

// query runs nvidia-smi for fields and splits its answer into lines of
// exactly len(fields) fields, skipping blank lines.
func query(ctx context.Context, path string, timeout time.Duration, fields []string) ([]*line, error) {
	out, err := runSMI(ctx, path, timeout, fields)
	if err != nil {
		return nil, err
	}
	var lines []*line
	n := 0
	for text := range strings.Lines(string(out)) {
		n++
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		if len(lines) == MaxDevices {
			return nil, &ParseError{Msg: fmt.Sprintf("more than %d GPUs listed", MaxDevices)}
		}
		l := &line{n: n, text: text, fields: strings.Split(text, ",")}
		if len(l.text) > 100 {
			l.text = l.text[:100]
		}
		if len(l.fields) != len(fields) {
			return nil, &ParseError{Line: n, Text: l.text,
				Msg: fmt.Sprintf("%d fields, want %d (%s)", len(l.fields), len(fields), strings.Join(fields, ","))}
		}
		for i := range l.fields {
			l.fields[i] = strings.TrimSpace(l.fields[i])
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// LookPath is the nvidia-smi that path names, as exec.LookPath finds it:
// "" is "nvidia-smi" on PATH. When there is none, the error wraps
// ErrNoNvidiaSMI.
func LookPath(path string) (string, error) {
	if path == "" {
		path = "nvidia-smi"
	}
	bin, err := exec.LookPath(path)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: %w", ErrNoNvidiaSMI, err)
		}
		return "", err
	}
	return bin, nil
}

// runSMI runs nvidia-smi once and returns its standard output.
func runSMI(ctx context.Context, path string, timeout time.Duration, fields []string) ([]byte, error) {
	bin, err := LookPath(path)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(tctx, bin, "--query-gpu="+strings.Join(fields, ","), "--format=csv,noheader,nounits")
	stdout := &capped{max: MaxOutputBytes, refuse: true}
	stderr := &capped{max: 512}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A child nvidia-smi leaves behind may hold the pipes open after it is
	// killed: Wait gives up on them this long after.
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	switch {
	case stdout.over:
		return nil, fmt.Errorf("%s: %w: over %d bytes", bin, ErrOutputTooLarge, MaxOutputBytes)
	case ctx.Err() != nil:
		return nil, fmt.Errorf("%s: %w", bin, ctx.Err())
	case tctx.Err() != nil:
		return nil, fmt.Errorf("%s did not answer within %v: %w", bin, timeout, tctx.Err())
	case err != nil:
		if msg := firstLine(stderr.b.Bytes()); msg != "" {
			return nil, fmt.Errorf("%s: %w: %s", bin, err, msg)
		}
		if msg := firstLine(stdout.b.Bytes()); msg != "" {
			return nil, fmt.Errorf("%s: %w: %s", bin, err, msg) // nvidia-smi says "No devices were found" there
		}
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return stdout.b.Bytes(), nil
}

// firstLine is the first non-blank line of b, printable, cut to 200
// bytes.
func firstLine(b []byte) string {
	for l := range strings.Lines(string(b)) {
		if l = strings.TrimSpace(l); l != "" {
			l = strings.Map(func(r rune) rune {
				if r < ' ' || r == 0x7f {
					return -1
				}
				return r
			}, l)
			if len(l) > 200 {
				l = l[:200]
			}
			return l
		}
	}
	return ""
}

// capped keeps the first max bytes written to it. Past them it refuses
// the write (refuse: the copy from the process ends, and so, by
// SIGPIPE, does a process that goes on writing) or drops it.
type capped struct {
	b      bytes.Buffer
	max    int
	refuse bool
	over   bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.b.Len(); len(p) > room {
		c.over = true
		if c.refuse {
			return 0, ErrOutputTooLarge
		}
		c.b.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.b.Write(p)
}
