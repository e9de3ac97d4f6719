package nodelane_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// maxTrackedBytes bounds every file the repository tracks: build outputs
// and data sets belong in .gitignore, not in every clone.
const maxTrackedBytes = 1 << 20

// TestNoBinariesTracked checks that no file git tracks is over 1 MiB or an
// executable of a known format (ELF, Mach-O, PE), such as a program built
// at the root by `go build` and committed by mistake.
func TestNoBinariesTracked(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git ls-files: %v", err)
		}
		t.Skipf("not a git checkout (%v)", err)
	}
	magics := map[string][]byte{
		"an ELF executable": []byte("\x7fELF"),
		"a Mach-O binary":   {0xcf, 0xfa, 0xed, 0xfe},
		"a PE executable":   []byte("MZ"),
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(name)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or a symlink
		}
		if fi.Size() > maxTrackedBytes {
			t.Errorf("%s is tracked and %d bytes, over %d", name, fi.Size(), maxTrackedBytes)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 4)
		n, _ := f.Read(head)
		f.Close()
		for what, magic := range magics {
			if bytes.HasPrefix(head[:n], magic) {
				t.Errorf("%s is tracked and is %s: add it to .gitignore", name, what)
			}
		}
	}
}
