package client

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/nodelane/nodelane/replay"
)

// Identity is what a worker node keeps between runs: its Ed25519 key
// (which never leaves the node) and, once registered, its node id, worker
// id and worker token. LoadOrCreateIdentity keeps it in a file only its
// owner can read. It is safe for concurrent use.
type Identity struct {
	key  ed25519.PrivateKey
	path string

	mu        sync.Mutex
	nodeID    string
	workerID  string
	token     string
	expiresAt time.Time
}

// identityFile is the JSON of an identity file.
type identityFile struct {
	Version int `json:"version"`
	// PrivateKey is the 32-byte Ed25519 seed, unpadded base64url.
	PrivateKey string `json:"private_key"`
	// PublicKey and KeyID are for people reading the file; the key is
	// derived from the seed.
	PublicKey      string     `json:"public_key"`
	KeyID          string     `json:"key_id"`
	NodeID         string     `json:"node_id,omitempty"`
	WorkerID       string     `json:"worker_id,omitempty"`
	WorkerToken    string     `json:"worker_token,omitempty"`
	TokenExpiresAt *time.Time `json:"token_expires_at,omitempty"`
}

// identityVersion is the version of the identity file format.
const identityVersion = 1

// NewIdentity returns an identity for key that lives in memory only: its
// registration is not saved anywhere.
func NewIdentity(key ed25519.PrivateKey) (*Identity, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("client: Ed25519 private key has %d bytes, not %d", len(key), ed25519.PrivateKeySize)
	}
	return &Identity{key: key}, nil
}

// LoadOrCreateIdentity loads the identity file at path or, if there is
// none, generates an Ed25519 key and creates the file (and its directory,
// 0700) with mode 0600. A file that its owner's group or others may read
// or write is refused, as is a file that is not a regular file: the key
// and token in it are the node's credentials. Every write is atomic (a
// temporary file in the same directory, synced, then renamed), so a crash
// never leaves half a file; two processes creating the file at once end up
// with the same key.
func LoadOrCreateIdentity(path string) (*Identity, error) {
	id, err := loadIdentity(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("client: generating a key: %w", err)
	}
	id = &Identity{key: key, path: path}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("client: identity directory: %w", err)
	}
	b, err := id.marshal()
	if err != nil {
		return nil, err
	}
	tmp, err := writeTemp(path, b)
	if err != nil {
		return nil, err
	}
	// Link, unlike rename, fails if the file appeared meanwhile: then the
	// other process's key wins and is loaded.
	err = os.Link(tmp, path)
	os.Remove(tmp)
	switch {
	case err == nil:
		syncDir(filepath.Dir(path))
		return id, nil
	case errors.Is(err, fs.ErrExist):
		return loadIdentity(path)
	}
	// A file system without hard links.
	if tmp, err = writeTemp(path, b); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("client: saving the identity: %w", err)
	}
	syncDir(filepath.Dir(path))
	return id, nil
}

func loadIdentity(path string) (*Identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("client: identity file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("client: identity file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" {
		return nil, fmt.Errorf("client: identity file %s has mode %04o: it holds the node's key and must be 0600 (chmod 600 %s)", path, perm, path)
	}
	var v identityFile
	dec := json.NewDecoder(f)
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("client: identity file %s: %w", path, err)
	}
	if v.Version != identityVersion {
		return nil, fmt.Errorf("client: identity file %s has version %d, not %d", path, v.Version, identityVersion)
	}
	seed, err := base64.RawURLEncoding.DecodeString(v.PrivateKey)
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("client: identity file %s: private_key is not a %d-byte Ed25519 seed in unpadded base64url", path, ed25519.SeedSize)
	}
	id := &Identity{key: ed25519.NewKeyFromSeed(seed), path: path,
		nodeID: v.NodeID, workerID: v.WorkerID, token: v.WorkerToken}
	if v.PublicKey != "" && v.PublicKey != id.PublicKey() {
		return nil, fmt.Errorf("client: identity file %s: public_key does not match private_key", path)
	}
	if v.TokenExpiresAt != nil {
		id.expiresAt = *v.TokenExpiresAt
	}
	return id, nil
}

// Key returns the node's private key.
func (id *Identity) Key() ed25519.PrivateKey { return id.key }

// PublicKey returns the public key as the register route's public_key
// carries it: the 32 raw bytes in unpadded base64url.
func (id *Identity) PublicKey() string {
	return base64.RawURLEncoding.EncodeToString(id.key.Public().(ed25519.PublicKey))
}

// KeyID returns the keyid the node's signatures carry.
func (id *Identity) KeyID() string { return replay.KeyID(id.key.Public().(ed25519.PublicKey)) }

// Path returns the identity's file, or "" for one in memory only.
func (id *Identity) Path() string { return id.path }

// NodeID returns the node id it registered under, or "".
func (id *Identity) NodeID() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.nodeID
}

// WorkerID returns the worker id the server assigned, or "".
func (id *Identity) WorkerID() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.workerID
}

// Token returns the worker token, or "" before registration.
func (id *Identity) Token() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.token
}

// TokenExpiresAt returns when the worker token expires (server time), or
// the zero time if unknown.
func (id *Identity) TokenExpiresAt() time.Time {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.expiresAt
}

// SetCredential sets the node id, worker id and worker token, for a node
// given its token some other way than Register, and saves the identity if
// it has a file.
func (id *Identity) SetCredential(nodeID, workerID, token string, expiresAt time.Time) error {
	return id.setRegistration(nodeID, workerID, token, expiresAt)
}

func (id *Identity) setRegistration(nodeID, workerID, token string, expiresAt time.Time) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.nodeID, id.workerID, id.token, id.expiresAt = nodeID, workerID, token, expiresAt
	if id.path == "" {
		return nil
	}
	b, err := id.marshalLocked()
	if err != nil {
		return err
	}
	return writeAtomic(id.path, b)
}

func (id *Identity) marshal() ([]byte, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.marshalLocked()
}

func (id *Identity) marshalLocked() ([]byte, error) {
	v := identityFile{
		Version:     identityVersion,
		PrivateKey:  base64.RawURLEncoding.EncodeToString(id.key.Seed()),
		PublicKey:   id.PublicKey(),
		KeyID:       id.KeyID(),
		NodeID:      id.nodeID,
		WorkerID:    id.workerID,
		WorkerToken: id.token,
	}
	if !id.expiresAt.IsZero() {
		t := id.expiresAt.UTC()
		v.TokenExpiresAt = &t
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("client: encoding the identity: %w", err)
	}
	return append(b, '\n'), nil
}

// writeTemp writes b to a new 0600 file beside path, synced, and returns
// its name.
func writeTemp(path string, b []byte) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("client: saving the identity: %w", err)
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(name)
		return "", fmt.Errorf("client: saving the identity: %w", err)
	}
	if err := f.Chmod(0o600); err != nil && runtime.GOOS != "windows" {
		return fail(err)
	}
	if _, err := f.Write(b); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(name)
		return "", fmt.Errorf("client: saving the identity: %w", err)
	}
	return name, nil
}

// writeAtomic replaces path with b: a synced temporary file renamed over
// it.
func writeAtomic(path string, b []byte) error {
	tmp, err := writeTemp(path, b)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("client: saving the identity: %w", err)
	}
	syncDir(filepath.Dir(path))
	return nil
}

// syncDir makes a rename in dir durable, where the platform allows.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
