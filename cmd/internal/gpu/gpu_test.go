package gpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/gpu/gputest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func TestSKU(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, want string }{
		{"NVIDIA GeForce RTX 4090", "rtx-4090"},
		{"NVIDIA GeForce RTX 4090 D", "rtx-4090-d"},
		{"NVIDIA GeForce RTX 4090 Laptop GPU", "rtx-4090-laptop"},
		{"NVIDIA GeForce RTX 3090 Ti", "rtx-3090-ti"},
		{"NVIDIA GeForce GTX 1080 Ti", "gtx-1080-ti"},
		{"NVIDIA A100-SXM4-80GB", "a100"},
		{"NVIDIA A100-SXM4-40GB", "a100"},
		{"NVIDIA A100 80GB PCIe", "a100"},
		{"NVIDIA A100-PCIE-40GB", "a100"},
		{"NVIDIA H100 80GB HBM3", "h100"},
		{"NVIDIA H100 PCIe", "h100"},
		{"NVIDIA H100 NVL", "h100-nvl"},
		{"NVIDIA H200", "h200"},
		{"NVIDIA GH200 480GB", "gh200"},
		{"NVIDIA B200", "b200"},
		{"NVIDIA L40S", "l40s"},
		{"NVIDIA L4", "l4"},
		{"NVIDIA A10G", "a10g"},
		{"NVIDIA RTX A6000", "rtx-a6000"},
		{"NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"},
		{"Quadro RTX 8000", "rtx-8000"},
		{"Tesla T4", "t4"},
		{"Tesla V100-SXM2-16GB", "v100"},
		{"Tesla V100-PCIE-32GB", "v100"},
		{"  nvidia   geforce rtx 4090  ", "rtx-4090"},
		{"NVIDIA GeForce RTX 5090 (GDDR7)", "rtx-5090"},
		{"Graphics Device", "graphics-device"},
		{"NVIDIA", UnknownSKU},
		{"", UnknownSKU},
		{"[N/A]", "n-a"},
		{"Ünïcode Ωmega 9000", "n-code-mega-9000"},
		{strings.Repeat("x", 100), strings.Repeat("x", MaxSKUBytes)},
		{strings.Repeat("abcdefghi ", 10), strings.TrimSuffix(strings.Repeat("abcdefghi-", 6), "-")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := SKU(tc.name)
			if got != tc.want {
				t.Errorf("SKU(%q) = %q, want %q", tc.name, got, tc.want)
			}
			if len(got) > MaxSKUBytes || len(got) > wire.MaxNameBytes {
				t.Errorf("SKU(%q) is %d bytes", tc.name, len(got))
			}
			if again := SKU(tc.name); again != got {
				t.Errorf("SKU(%q) is %q, then %q", tc.name, got, again)
			}
		})
	}
}

// fake puts a fake nvidia-smi with answers first on PATH, before the
// directories of sleep.
func fake(t *testing.T, answers map[string]string) string {
	t.Helper()
	dir, path := gputest.Write(t, answers)
	t.Setenv("PATH", dir+string(os.PathListSeparator)+"/usr/bin:/bin")
	return path
}

// fakePath writes a fake nvidia-smi with answers and returns its path,
// for a test that passes it to Discover and leaves PATH alone (and so can
// run in parallel).
func fakePath(t *testing.T, answers map[string]string) string {
	t.Helper()
	_, path := gputest.Write(t, answers)
	return path
}

// TestDiscover checks Discover's parsing of nvidia-smi's answer. The
// cases that look nvidia-smi up on PATH set it, one at a time; the others
// name the fake and run in parallel.
func TestDiscover(t *testing.T) {
	ctx := context.Background()
	t.Run("two GPUs from PATH", func(t *testing.T) {
		fake(t, gputest.TwoGPUs)
		got, err := Discover(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		want := []Device{
			{Index: 0, UUID: "GPU-5d3b2c9e-1f0a-4b7c-9d2e-3a4b5c6d7e8f", Name: "NVIDIA GeForce RTX 4090", MemoryMB: 24564},
			{Index: 1, UUID: "GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d", Name: "NVIDIA GeForce RTX 4090", MemoryMB: 24564},
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Discover = %+v, want %+v", got, want)
		}
		if g := GPUs(got); !reflect.DeepEqual(g, []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24564}, {SKU: "rtx-4090", VRAMMB: 24564}}) {
			t.Errorf("GPUs = %+v", g)
		}
	})
	t.Run("a path given, none on PATH", func(t *testing.T) {
		_, path := gputest.Write(t, gputest.TwoGPUs)
		t.Setenv("PATH", t.TempDir())
		if got, err := Discover(ctx, path); err != nil || len(got) != 2 {
			t.Fatalf("Discover(%s) = %+v, %v", path, got, err)
		}
	})
	t.Run("N/A and odd spacing", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: "\n  0 ,GPU-0,  [N/A] , [Not Supported]\r\n\n1,GPU-1,NVIDIA H100 80GB HBM3,81559.0\n   \n"})
		got, err := Discover(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		want := []Device{{Index: 0, UUID: "GPU-0"}, {Index: 1, UUID: "GPU-1", Name: "NVIDIA H100 80GB HBM3", MemoryMB: 81559}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Discover = %+v, want %+v", got, want)
		}
		if g := GPUs(got); g[0] != (wire.GPU{SKU: UnknownSKU}) || g[1] != (wire.GPU{SKU: "h100", VRAMMB: 81559}) {
			t.Errorf("GPUs = %+v", g)
		}
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: ""})
		if got, err := Discover(ctx, path); err != nil || len(got) != 0 {
			t.Fatalf("Discover = %+v, %v; want no GPU", got, err)
		}
	})
	for _, tc := range []struct{ name, answer, line, msg string }{
		{"too few fields", "0, GPU-0, NVIDIA L4, 23034\n1, GPU-1, NVIDIA L4\n", `line 2 ("1, GPU-1, NVIDIA L4")`, "3 fields, want 4"},
		{"too many fields", "0, GPU-0, NVIDIA L4, 23034, 7\n", "line 1", "5 fields, want 4"},
		{"index not a number", "zero, GPU-0, NVIDIA L4, 23034\n", "line 1", `index "zero" is not a number`},
		{"index N/A", "[N/A], GPU-0, NVIDIA L4, 23034\n", "line 1", `index "" is not a number`},
		{"negative index", "-1, GPU-0, NVIDIA L4, 23034\n", "line 1", `index "-1"`},
		{"index twice", "0, GPU-0, NVIDIA L4, 1\n\n0, GPU-1, NVIDIA L4, 1\n", "line 3", "index 0 is listed twice"},
		{"uuid twice", "0, GPU-0, NVIDIA L4, 1\n1, GPU-0, NVIDIA L4, 1\n", "line 2", "uuid GPU-0 is listed twice"},
		{"no uuid", "0, [N/A], NVIDIA L4, 1\n", "line 1", "no uuid"},
		{"odd uuid", "0, GPU 0\"x, NVIDIA L4, 1\n", "line 1", "holds a character"},
		{"long uuid", "0, GPU-" + strings.Repeat("0", MaxUUIDBytes) + ", NVIDIA L4, 1\n", "line 1", "uuid is over 64 bytes"},
		{"memory not a number", "0, GPU-0, NVIDIA L4, 23034 MiB\n", "line 1", `memory.total "23034 MiB" is not a number`},
		{"memory negative", "0, GPU-0, NVIDIA L4, -5\n", "line 1", `memory.total "-5"`},
		{"memory huge", "0, GPU-0, NVIDIA L4, 1e12\n", "line 1", `memory.total "1e12"`},
		{"a header", "index, uuid, name, memory.total [MiB]\n", "line 1", `index "index"`},
		{"too many GPUs", manyLines(MaxDevices+1, "%d, GPU-%d, NVIDIA L4, 23034\n"), "", "more than 64 GPUs listed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := fakePath(t, map[string]string{gputest.DiscoverQuery: tc.answer})
			got, err := Discover(ctx, path)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Discover = %+v, %v; want a *ParseError", got, err)
			}
			if !strings.Contains(err.Error(), tc.line) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not name %q and say %q", err, tc.line, tc.msg)
			}
		})
	}
	t.Run("64 GPUs", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: manyLines(MaxDevices, "%d, GPU-%d, NVIDIA L4, 23034\n")})
		if got, err := Discover(ctx, path); err != nil || len(got) != MaxDevices {
			t.Fatalf("Discover found %d GPUs, %v; want %d", len(got), err, MaxDevices)
		}
	})
}

func manyLines(n int, format string) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, format, i, i)
	}
	return b.String()
}

// TestDiscoverFailures checks Discover's errors: no nvidia-smi, one that
// fails, is given the wrong arguments, hangs, or writes without end.
func TestDiscoverFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("not on PATH", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		_, err := Discover(ctx, "")
		if !errors.Is(err, ErrNoNvidiaSMI) {
			t.Fatalf("Discover = %v, want ErrNoNvidiaSMI", err)
		}
	})
	t.Run("not at the path given", func(t *testing.T) {
		t.Parallel()
		_, err := Discover(ctx, filepath.Join(t.TempDir(), "nvidia-smi"))
		if !errors.Is(err, ErrNoNvidiaSMI) {
			t.Fatalf("Discover = %v, want ErrNoNvidiaSMI", err)
		}
	})
	t.Run("not executable", func(t *testing.T) {
		t.Parallel()
		_, path := gputest.Write(t, gputest.TwoGPUs)
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Discover(ctx, path)
		if err == nil || errors.Is(err, ErrNoNvidiaSMI) {
			t.Fatalf("Discover = %v, want an error that is not ErrNoNvidiaSMI", err)
		}
	})
	t.Run("fails", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: "#!echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"})
		_, err := Discover(ctx, path)
		if err == nil || !strings.Contains(err.Error(), "exit status 9") || !strings.Contains(err.Error(), "could not communicate") {
			t.Fatalf("Discover = %v, want exit status 9 and nvidia-smi's message", err)
		}
	})
	t.Run("wrong arguments", func(t *testing.T) {
		// The fake knows only the sampler's query: Discover's arguments are
		// checked.
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.SampleQuery: "0, GPU-0, 1, 1, 1, 1"})
		_, err := Discover(ctx, path)
		if err == nil || !strings.Contains(err.Error(), "unexpected argument --query-gpu="+gputest.DiscoverQuery) {
			t.Fatalf("Discover = %v, want the fake's complaint", err)
		}
	})
	t.Run("hangs", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: "#!sleep 5"})
		start := time.Now()
		_, err := discover(ctx, path, 300*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer within 300ms") {
			t.Fatalf("discover = %v, want a timeout", err)
		}
		// The killed shell's sleep holds the pipe: Wait gives up on it
		// after WaitDelay.
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("a hung nvidia-smi held Discover %v", d)
		}
	})
	t.Run("caller's context", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: "#!exec sleep 5"})
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := Discover(cctx, path)
		if !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "did not answer") {
			t.Fatalf("Discover = %v, want the caller's deadline", err)
		}
	})
	t.Run("megabytes", func(t *testing.T) {
		t.Parallel()
		path := fakePath(t, map[string]string{gputest.DiscoverQuery: "#!i=0; while [ $i -lt 100000 ]; do echo \"$i, GPU-$i, NVIDIA GeForce RTX 4090, 24564\"; i=$((i+1)); done"})
		start := time.Now()
		_, err := Discover(ctx, path)
		if !errors.Is(err, ErrOutputTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(MaxOutputBytes)) {
			t.Fatalf("Discover = %v, want ErrOutputTooLarge", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("an endless nvidia-smi held Discover %v", d)
		}
	})
}
