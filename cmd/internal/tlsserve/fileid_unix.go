//go:build unix

package tlsserve

import (
	"io/fs"
	"syscall"
)

// fileID is the device and inode of a file: a file replaced by another of
// the same size and time still differs in them.
func fileID(fi fs.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), uint64(st.Ino)
	}
	return 0, 0
}
