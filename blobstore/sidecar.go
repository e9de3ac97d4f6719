package blobstore

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// sidecar writes the metadata of an object of a file:// store in the
// file fileblob reads it from: "<path>.attrs", JSON. fileblob writes it
// itself only while it hashes every byte with MD5, which a store whose
// caller hashes with SHA-256 anyway does not need; the bucket is opened
// with fileblob.MetadataDontWrite, and Put writes the sidecar before the
// object's file takes its name, as fileblob does. The conformance suite
// (Stat, Replace) fails if fileblob ever reads it differently.
type sidecar struct {
	root string
	path string // the object's file, from its temporary file's name
}

// attrs is the part of fileblob's sidecar format a Store uses.
type attrs struct {
	ContentType string            `json:"user.content_type"`
	Metadata    map[string]string `json:"user.metadata"`
}

// beforeWrite is blob.WriterOptions.BeforeWrite: it learns the path of
// the object from the temporary file fileblob writes ("<path>.<hex>.tmp"
// beside it, fileblob.Options.NoTempDir).
func (s *sidecar) beforeWrite(as func(any) bool) error {
	var f *os.File
	if !as(&f) {
		return fmt.Errorf("blobstore: the file bucket gave no temporary file")
	}
	name, ok := strings.CutSuffix(f.Name(), ".tmp")
	if i := strings.LastIndexByte(name, '.'); ok && i > 0 {
		name = name[:i]
	} else {
		return fmt.Errorf("blobstore: unexpected temporary file name %q", f.Name())
	}
	if !strings.HasPrefix(name, s.root+string(filepath.Separator)) {
		return fmt.Errorf("blobstore: temporary file %q is outside the store", f.Name())
	}
	s.path = name
	return nil
}

// write writes the sidecar whole under a temporary name, then renames it.
func (s *sidecar) write(metadata map[string]string) error {
	if s.path == "" {
		return fmt.Errorf("blobstore: no object path for the metadata")
	}
	b, err := json.Marshal(attrs{ContentType: ContentType, Metadata: metadata})
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(s.path), filepath.Base(s.path)+".*.tmp")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), s.path+".attrs"); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// remove removes the sidecar of an object whose file did not take its
// name.
func (s *sidecar) remove() {
	if s.path != "" {
		_ = os.Remove(s.path + ".attrs")
	}
}
