package gpu

import (
	"regexp"
	"strings"
)

// UnknownSKU is the SKU of a GPU whose name says nothing SKU holds.
const UnknownSKU = "unknown"

// MaxSKUBytes bounds a SKU made from a name: well within the
// wire.MaxNameBytes a registration allows.
const MaxSKUBytes = 64

// dropWords are the words of an nvidia-smi name that SKU leaves out:
// vendor and brand, filler, and the board's interface.
var dropWords = map[string]bool{
	"nvidia": true, "geforce": true, "tesla": true, "quadro": true,
	"gpu": true, "generation": true, "pcie": true, "sxm": true,
}

// memoryWord matches the words that name a board's memory (80gb, hbm3,
// gddr6x) or interface (sxm4): VRAM is reported as vram_mb, not in the
// SKU.
var memoryWord = regexp.MustCompile(`^([0-9]+gb|hbm[0-9a-z]*|gddr[0-9a-z]*|sxm[0-9]+)$`)

// SKU turns the name nvidia-smi reports into the short SKU the control
// plane matches jobs against and prices by, as the -gpu flag spells it
// ("rtx-4090", "h100"). It lower-cases the name, splits it at every
// character that is not a letter or a digit, leaves out the vendor and
// brand words (NVIDIA, GeForce, Tesla, Quadro), "GPU" and "Generation",
// the board's interface (PCIe, SXM, SXM4, ...) and its memory (80GB,
// HBM3, GDDR6X, ...), and joins what remains with "-":
//
//	NVIDIA GeForce RTX 4090        rtx-4090
//	NVIDIA A100-SXM4-80GB          a100
//	NVIDIA H100 80GB HBM3          h100
//	NVIDIA H100 PCIe               h100
//	NVIDIA H100 NVL                h100-nvl
//	NVIDIA RTX 6000 Ada Generation rtx-6000-ada
//	Tesla T4                       t4
//
// So one model is one SKU whatever its memory size (the registration's
// vram_mb tells 40 GB from 80 GB, and a job asks for it with
// min_vram_mb) and whatever its board; a fleet that prices SXM and PCIe
// boards apart names its GPUs with -gpu instead. A SKU is at most
// MaxSKUBytes (cut at a word), and a name with nothing left is
// UnknownSKU. The same name always gives the same SKU.
func SKU(name string) string {
	words := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9')
	})
	var b strings.Builder
	for _, w := range words {
		if dropWords[w] || memoryWord.MatchString(w) {
			continue
		}
		n := len(w)
		if b.Len() > 0 {
			n++
		}
		if b.Len() == 0 && n > MaxSKUBytes {
			w, n = w[:MaxSKUBytes], MaxSKUBytes
		}
		if b.Len()+n > MaxSKUBytes {
			break
		}
		if b.Len() > 0 {
			b.WriteByte('-')
		}
		b.WriteString(w)
	}
	if b.Len() == 0 {
		return UnknownSKU
	}
	return b.String()
}
