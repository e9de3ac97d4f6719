package wire

import (
	"net/url"
	"strconv"
	"time"
)

// Artifact bytes (PROTOCOL.md §5.19 to §5.21 and §13): a worker asks for
// an upload, sends its parts, then finishes it on the artifacts route
// with the upload's id.

// ActionUploads is the action of POST /workers/jobs/{id}/uploads, for
// JobPath.
const ActionUploads = "uploads"

// HeaderLeaseToken carries the lease token on the routes whose body is
// not JSON: a part's PUT and an artifact's content GET. It is a secret,
// as the lease_token of a JSON body is: never logged.
const HeaderLeaseToken = "Nodelane-Lease-Token"

// CheckpointType is the artifact_type of a checkpoint: the latest stored
// one of a job's earlier attempts is named in the grant of a later
// attempt (Job.ResumeFrom).
const CheckpointType = "checkpoint"

// UploadPartPath is the control-plane route of part n of an upload:
// /workers/jobs/{id}/uploads/{upload_id}/parts/{n}, path-escaped.
func UploadPartPath(jobID, uploadID string, n int) string {
	return JobPath(jobID, ActionUploads) + "/" + url.PathEscape(uploadID) + "/parts/" + strconv.Itoa(n)
}

// ArtifactContentPath is the worker route of an artifact's bytes:
// /workers/jobs/{id}/artifacts/{artifact_id}/content.
func ArtifactContentPath(jobID, artifactID string) string {
	return JobPath(jobID, ActionArtifacts) + "/" + url.PathEscape(artifactID) + "/content"
}

// OperatorArtifactContentPath is the operator route of an artifact's
// bytes: /operator/artifacts/{id}/content.
func OperatorArtifactContentPath(artifactID string) string {
	return "/operator/artifacts/" + url.PathEscape(artifactID) + "/content"
}

// UploadRequest is the body of POST /workers/jobs/{id}/uploads: the
// artifact a worker is about to send, as it will declare it when it
// finishes.
type UploadRequest struct {
	LeaseToken   string `json:"lease_token"`
	ArtifactType string `json:"artifact_type"`
	Name         string `json:"name"`
	// SizeBytes is required (0 or more) and at most the server's
	// bytes per artifact.
	SizeBytes *int64 `json:"size_bytes"`
	// ChecksumSHA256 is required: 64 lowercase hex digits.
	ChecksumSHA256 string `json:"checksum_sha256"`
	// IdempotencyKey, when set, makes the request repeatable: a repeat
	// with the same key and body gets the first answer.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// UploadResponse answers an upload request: where each part goes.
type UploadResponse struct {
	// UploadID names the upload on the parts' route and when finishing.
	UploadID string `json:"upload_id"`
	// PartSize is the size of every part but the last.
	PartSize  int64     `json:"part_size"`
	ExpiresAt time.Time `json:"expires_at"`
	// Direct is true when the parts go straight to the store by presigned
	// URLs (no credential, no signature), false when they go to the
	// control plane's part route as signed requests.
	Direct bool         `json:"direct"`
	Parts  []UploadPart `json:"parts"`
}

// UploadPart is where one part of an upload goes.
type UploadPart struct {
	// PartNumber counts from 1.
	PartNumber int   `json:"part_number"`
	Offset     int64 `json:"offset"`
	SizeBytes  int64 `json:"size_bytes"`
	// Method is "PUT".
	Method string `json:"method"`
	// URL is a path relative to the control plane's base URL (Direct
	// false) or an absolute presigned URL (Direct true).
	URL string `json:"url"`
	// Headers are the headers a direct PUT must carry; empty otherwise.
	Headers map[string]string `json:"headers"`
}

// UploadPartResponse answers a part sent to the control plane.
type UploadPartResponse struct {
	PartNumber int   `json:"part_number"`
	SizeBytes  int64 `json:"size_bytes"`
	// ExpiresAt is the lease's expiry, extended by the part.
	ExpiresAt time.Time `json:"expires_at"`
}

// ResumeFrom names the checkpoint a later attempt of a job resumes from:
// the latest stored artifact of type CheckpointType of its earlier
// attempts.
type ResumeFrom struct {
	ArtifactID     string `json:"artifact_id"`
	Name           string `json:"name"`
	SizeBytes      int64  `json:"size_bytes"`
	ChecksumSHA256 string `json:"checksum_sha256"`
	// URL, when set, is a presigned GET of the bytes; without it the
	// worker reads them from ArtifactContentPath.
	URL string `json:"url,omitempty"`
}
