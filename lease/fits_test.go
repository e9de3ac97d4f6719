package lease_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

// referenceFits is the definition of Worker.Fits, written plainly (and in
// quadratic time): for each offered SKU, in the order the worker lists
// them, then for all those GPUs together, each GPU's VRAM (capped by the
// governor) with the number of GPUs that have at least as much; shapes
// listed once, after the CPU-only shape.
func referenceFits(w *lease.Worker, offered []string) []lease.Fit {
	out := []lease.Fit{{}}
	add := func(sku string, gpus []lease.GPU) {
		for _, g := range gpus {
			n := 0
			for _, h := range gpus {
				if h.VRAMMB >= g.VRAMMB {
					n++
				}
			}
			v := g.VRAMMB
			if w.Governor.MaxVRAMMB > 0 {
				v = min(v, w.Governor.MaxVRAMMB)
			}
			if f := (lease.Fit{SKU: sku, GPUs: n, VRAMMB: v}); !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	var skus []string
	for _, g := range w.Capabilities.GPUs {
		if !slices.Contains(skus, g.SKU) && (len(offered) == 0 || slices.Contains(offered, g.SKU)) {
			skus = append(skus, g.SKU)
		}
	}
	var all []lease.GPU
	for _, sku := range skus {
		var of []lease.GPU
		for _, g := range w.Capabilities.GPUs {
			if g.SKU == sku {
				of = append(of, g)
			}
		}
		add(sku, of)
		all = append(all, of...)
	}
	add("", all)
	return out
}

func TestFits(t *testing.T) {
	t.Parallel()
	gpu := func(sku string, vram int) lease.GPU { return lease.GPU{SKU: sku, VRAMMB: vram} }
	for _, tc := range []struct {
		name    string
		gpus    []lease.GPU
		maxVRAM int
		offered []string
		want    []lease.Fit
	}{
		{name: "no GPU", want: []lease.Fit{{}}},
		{
			name: "two equal cards",
			gpus: []lease.GPU{gpu("a", 24), gpu("a", 24)},
			want: []lease.Fit{{}, {SKU: "a", GPUs: 2, VRAMMB: 24}, {SKU: "", GPUs: 2, VRAMMB: 24}},
		},
		{
			name: "mixed sizes and SKUs",
			gpus: []lease.GPU{gpu("a", 16), gpu("b", 80), gpu("a", 24)},
			want: []lease.Fit{{},
				{SKU: "a", GPUs: 2, VRAMMB: 16}, {SKU: "a", GPUs: 1, VRAMMB: 24},
				{SKU: "b", GPUs: 1, VRAMMB: 80},
				{SKU: "", GPUs: 3, VRAMMB: 16}, {SKU: "", GPUs: 2, VRAMMB: 24}, {SKU: "", GPUs: 1, VRAMMB: 80},
			},
		},
		{
			name: "governor caps the size", maxVRAM: 20,
			gpus: []lease.GPU{gpu("a", 16), gpu("a", 24)},
			want: []lease.Fit{{},
				{SKU: "a", GPUs: 2, VRAMMB: 16}, {SKU: "a", GPUs: 1, VRAMMB: 20},
				{SKU: "", GPUs: 2, VRAMMB: 16}, {SKU: "", GPUs: 1, VRAMMB: 20},
			},
		},
		{
			name: "only the offered SKUs", offered: []string{"b", "z"},
			gpus: []lease.GPU{gpu("a", 16), gpu("b", 80)},
			want: []lease.Fit{{}, {SKU: "b", GPUs: 1, VRAMMB: 80}, {SKU: "", GPUs: 1, VRAMMB: 80}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := &lease.Worker{Capabilities: lease.Capabilities{GPUs: tc.gpus}, Governor: lease.Governor{MaxVRAMMB: tc.maxVRAM}}
			if diff := cmp.Diff(tc.want, w.Fits(tc.offered)); diff != "" {
				t.Errorf("Fits (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(referenceFits(w, tc.offered), w.Fits(tc.offered)); diff != "" {
				t.Errorf("Fits differs from the reference (-ref +got):\n%s", diff)
			}
		})
	}
}

// TestFitsMatchesReference compares Fits with its plain definition on
// random workers.
func TestFitsMatchesReference(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	skus := []string{"a", "b", "c", ""} // "" is a GPU without a SKU
	for i := range 2000 {
		w := &lease.Worker{}
		for range r.IntN(20) {
			w.Capabilities.GPUs = append(w.Capabilities.GPUs, lease.GPU{SKU: skus[r.IntN(len(skus))], VRAMMB: 8 * r.IntN(6)})
		}
		if r.IntN(3) == 0 {
			w.Governor.MaxVRAMMB = 8 * r.IntN(6)
		}
		var offered []string
		for _, s := range skus {
			if r.IntN(3) == 0 {
				offered = append(offered, s)
			}
		}
		if diff := cmp.Diff(referenceFits(w, offered), w.Fits(offered)); diff != "" {
			t.Fatalf("case %d: GPUs %v, max_vram_mb %d, offered %v (-ref +got):\n%s",
				i, w.Capabilities.GPUs, w.Governor.MaxVRAMMB, offered, diff)
		}
	}
}

// manyGPUs is a worker with n GPUs of distinct sizes over 4 SKUs, the
// worst case for Fits: every GPU is a shape of its own.
func manyGPUs(n int) *lease.Worker {
	w := &lease.Worker{}
	for i := range n {
		w.Capabilities.GPUs = append(w.Capabilities.GPUs, lease.GPU{SKU: fmt.Sprint("sku-", i%4), VRAMMB: 1000 + i})
	}
	return w
}

// TestFitsIsNotQuadratic checks that 100,000 GPUs (once a node could declare that
// many) take well under a second; the quadratic count took minutes.
func TestFitsIsNotQuadratic(t *testing.T) {
	t.Parallel()
	w := manyGPUs(100_000)
	start := time.Now()
	fs := w.Fits(nil)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Fits of %d GPUs took %v", len(w.Capabilities.GPUs), d)
	}
	if len(fs) != 1+2*len(w.Capabilities.GPUs) {
		t.Errorf("Fits lists %d shapes, want %d", len(fs), 1+2*len(w.Capabilities.GPUs))
	}
}

// BenchmarkFits measures Fits for G and 10G GPUs: ns/op grows about
// tenfold (G log G), not a hundredfold.
func BenchmarkFits(b *testing.B) {
	for _, n := range []int{64, 640, 6400, 64000} {
		w := manyGPUs(n)
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w.Fits(nil)
			}
		})
	}
}
