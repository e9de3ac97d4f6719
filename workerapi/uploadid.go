package workerapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// An upload (PROTOCOL.md §5.19) is stateless: everything the parts'
// route and the finish need is in its id, which the control plane MACs
// so that a worker cannot forge or change one. The id is
// "upl_" + base64url(payload) + "." + base64url(HMAC-SHA256(k, payload)),
// k = HMAC-SHA256(Peppers[v], "nodelane upload id v1"), v the pepper
// version in the payload: replicas that share the peppers accept each
// other's ids.

// uploadPrefix starts every upload id.
const uploadPrefix = "upl_"

// upload is an upload id's payload.
type upload struct {
	Pepper int    `json:"v"`
	JobID  string `json:"j"`
	Epoch  int64  `json:"e"`
	// Rand is 16 random bytes in hex: the upload's directory in the store.
	Rand     string `json:"r"`
	Size     int64  `json:"s"`
	SHA256   string `json:"c"`
	PartSize int64  `json:"p"`
	Expires  int64  `json:"x"`
	Direct   bool   `json:"d"`
}

// uploadKey is the MAC key of upload ids under pepper.
func uploadKey(pepper []byte) []byte {
	m := hmac.New(sha256.New, pepper)
	m.Write([]byte("nodelane upload id v1"))
	return m.Sum(nil)
}

// newUpload returns an upload of size bytes for the job's lease epoch,
// sealed, from now.
func (s *Server) newUpload(jobID string, epoch, size int64, sum string, direct bool) (*upload, string, error) {
	var r [16]byte
	if _, err := io.ReadFull(s.cfg.Rand, r[:]); err != nil {
		return nil, "", fmt.Errorf("workerapi: reading randomness: %w", err)
	}
	u := &upload{
		Pepper: s.cfg.PepperVersion, JobID: jobID, Epoch: epoch, Rand: hex.EncodeToString(r[:]),
		Size: size, SHA256: sum, PartSize: s.cfg.Artifacts.PartSize,
		Expires: s.now().Add(s.cfg.Artifacts.UploadTTL).Unix(), Direct: direct,
	}
	payload, err := json.Marshal(u)
	if err != nil {
		return nil, "", err
	}
	m := hmac.New(sha256.New, uploadKey(s.cfg.Peppers[u.Pepper]))
	m.Write(payload)
	return u, uploadPrefix + base64.RawURLEncoding.EncodeToString(payload) + "." +
		base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

// openUpload checks an upload id for the job jobID and returns its
// payload: ErrUploadInvalid for an id this control plane did not issue,
// or issued for another job; ErrUploadExpired for one whose time ran out.
func (s *Server) openUpload(id, jobID string) (*upload, error) {
	bad := fmt.Errorf("%w: the upload_id is not one issued for this job", ErrUploadInvalid)
	rest, ok := strings.CutPrefix(id, uploadPrefix)
	if !ok {
		return nil, bad
	}
	p64, m64, ok := strings.Cut(rest, ".")
	if !ok {
		return nil, bad
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(p64)
	if err != nil {
		return nil, bad
	}
	mac, err := base64.RawURLEncoding.Strict().DecodeString(m64)
	if err != nil {
		return nil, bad
	}
	// The pepper version is read before the MAC is checked: it only picks
	// the key, and a wrong one fails the MAC.
	var head struct {
		Pepper int `json:"v"`
	}
	if json.Unmarshal(payload, &head) != nil || s.cfg.Peppers[head.Pepper] == nil {
		return nil, bad
	}
	m := hmac.New(sha256.New, uploadKey(s.cfg.Peppers[head.Pepper]))
	m.Write(payload)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return nil, bad
	}
	var u upload
	if err := json.Unmarshal(payload, &u); err != nil || u.JobID != jobID || u.PartSize <= 0 || u.Size < 0 {
		return nil, bad
	}
	if !s.now().Before(time.Unix(u.Expires, 0)) {
		return nil, fmt.Errorf("%w: the upload_id expired at %s: ask for a new upload", ErrUploadExpired,
			time.Unix(u.Expires, 0).UTC().Format(time.RFC3339))
	}
	return &u, nil
}

// prefix is the key prefix of the upload's parts: the stored artifact's
// Object.
func (u *upload) prefix() string { return artifactPrefix(u.JobID) + u.Rand + "/" }

// parts is how many parts the upload has: a 0-byte upload has one.
func (u *upload) parts() int { return partCount(u.Size, u.PartSize) }

// partLen is the size of part n (from 1).
func (u *upload) partLen(n int) int64 { return partLen(u.Size, u.PartSize, n) }

// expiresAt is when the upload's id stops holding.
func (u *upload) expiresAt() time.Time { return time.Unix(u.Expires, 0).UTC() }

// artifactPrefix is the key prefix of every object of the job jobID:
// "jobs/<job dir>/" (jobDir).
func artifactPrefix(jobID string) string { return "jobs/" + jobDir(jobID) + "/" }

// jobDir is the directory of the job jobID's objects: the id itself
// when it is made of the characters keys allow (and neither starts with
// '.' nor with "h-"), else "h-" and the id in hex. jobOfDir reverses it.
func jobDir(jobID string) string {
	safe := jobID != "" && jobID[0] != '.' && !strings.HasPrefix(jobID, "h-") &&
		strings.Trim(jobID, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") == ""
	if safe {
		return jobID
	}
	return "h-" + hex.EncodeToString([]byte(jobID))
}

// jobOfDir is the job whose directory is dir, or false.
func jobOfDir(dir string) (string, bool) {
	h, ok := strings.CutPrefix(dir, "h-")
	if !ok {
		return dir, dir != ""
	}
	b, err := hex.DecodeString(h)
	return string(b), err == nil && len(b) > 0
}

// partKey is the key of part n under prefix: six digits from 000001.
func partKey(prefix string, n int) string { return fmt.Sprintf("%s%06d", prefix, n) }

// sumKey is the key of part n's chain record (see streamPart).
func sumKey(prefix string, n int) string { return partKey(prefix, n) + ".sum" }

func partCount(size, partSize int64) int {
	if size == 0 {
		return 1
	}
	return int((size + partSize - 1) / partSize)
}

func partLen(size, partSize int64, n int) int64 {
	off := int64(n-1) * partSize
	return min(partSize, size-off)
}
