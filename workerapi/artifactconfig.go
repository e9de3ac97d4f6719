package workerapi

import (
	"fmt"
	"time"
)

// The defaults and bounds of ArtifactConfig.
const (
	DefaultMaxArtifactBytes    = 10 << 30
	DefaultMaxArtifactsPerJob  = 100
	DefaultMaxUploadsPerWorker = 4
	DefaultPartSize            = 64 << 20
	DefaultUploadTTL           = time.Hour
	DefaultSweepInterval       = 10 * time.Minute
	// MinPartSize is the smallest ArtifactConfig.PartSize.
	MinPartSize = 1 << 20
	// MaxUploadParts bounds the parts of one upload: MaxBytes / PartSize
	// may not exceed it.
	MaxUploadParts = 10000
	// maxArtifactsPerJob bounds MaxPerJob: one page of a job's artifacts.
	maxArtifactsPerJob = 999
)

// ArtifactConfig says whether and how a Server keeps the bytes of
// artifacts (PROTOCOL.md §5.19 to §5.21). A zero value keeps none: every
// artifact is metadata only, and the upload routes answer 404
// artifact_storage_off. A zero limit means its default; a negative one is
// an error from New.
type ArtifactConfig struct {
	// Store keeps the bytes. Nil: artifacts are metadata only. When it is
	// also an ArtifactPresigner (and NoPresign is false), workers send
	// parts and read checkpoints directly by presigned URLs.
	Store ArtifactStore
	// MaxBytes bounds one artifact's size. Defaults to
	// DefaultMaxArtifactBytes (10 GiB).
	MaxBytes int64
	// MaxPerJob bounds the artifacts of one job, metadata-only ones
	// included. Defaults to DefaultMaxArtifactsPerJob.
	MaxPerJob int
	// MaxUploadsPerWorker bounds the parts one worker streams through
	// this Server at once. Defaults to DefaultMaxUploadsPerWorker.
	MaxUploadsPerWorker int
	// PartSize is the size of every part of an upload but the last, at
	// least MinPartSize. Defaults to DefaultPartSize (64 MiB).
	PartSize int64
	// UploadTTL is how long an upload's id and URLs hold; an upload not
	// finished within it is swept. Defaults to DefaultUploadTTL.
	UploadTTL time.Duration
	// NoPresign never hands out presigned URLs, even when Store is an
	// ArtifactPresigner: every byte then passes through the control plane.
	NoPresign bool
	// SweepInterval is how often the maintainer deletes the objects of
	// deleted jobs and of uploads never finished. Defaults to
	// DefaultSweepInterval.
	SweepInterval time.Duration

	// smallParts lets a test set a PartSize below MinPartSize.
	smallParts bool
}

// WithDefaults returns c with its defaults filled in, or an error
// wrapping ErrConfig that names the first invalid setting.
func (c ArtifactConfig) WithDefaults() (ArtifactConfig, error) {
	switch {
	case c.MaxBytes < 0:
		return c, fmt.Errorf("%w: Artifacts.MaxBytes is negative (%d)", ErrConfig, c.MaxBytes)
	case c.MaxPerJob < 0:
		return c, fmt.Errorf("%w: Artifacts.MaxPerJob is negative (%d)", ErrConfig, c.MaxPerJob)
	case c.MaxUploadsPerWorker < 0:
		return c, fmt.Errorf("%w: Artifacts.MaxUploadsPerWorker is negative (%d)", ErrConfig, c.MaxUploadsPerWorker)
	case c.PartSize < 0:
		return c, fmt.Errorf("%w: Artifacts.PartSize is negative (%d)", ErrConfig, c.PartSize)
	case c.UploadTTL < 0:
		return c, fmt.Errorf("%w: Artifacts.UploadTTL is negative (%v)", ErrConfig, c.UploadTTL)
	case c.SweepInterval < 0:
		return c, fmt.Errorf("%w: Artifacts.SweepInterval is negative (%v)", ErrConfig, c.SweepInterval)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxArtifactBytes
	}
	if c.MaxPerJob == 0 {
		c.MaxPerJob = DefaultMaxArtifactsPerJob
	}
	if c.MaxUploadsPerWorker == 0 {
		c.MaxUploadsPerWorker = DefaultMaxUploadsPerWorker
	}
	if c.PartSize == 0 {
		c.PartSize = DefaultPartSize
	}
	if c.UploadTTL == 0 {
		c.UploadTTL = DefaultUploadTTL
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	switch {
	case c.MaxPerJob > maxArtifactsPerJob:
		return c, fmt.Errorf("%w: Artifacts.MaxPerJob %d is over %d", ErrConfig, c.MaxPerJob, maxArtifactsPerJob)
	case c.PartSize < MinPartSize && !c.smallParts:
		return c, fmt.Errorf("%w: Artifacts.PartSize %d is under %d bytes", ErrConfig, c.PartSize, MinPartSize)
	case (c.MaxBytes+c.PartSize-1)/c.PartSize > MaxUploadParts:
		return c, fmt.Errorf("%w: Artifacts.MaxBytes %d would take more than %d parts of Artifacts.PartSize %d", ErrConfig, c.MaxBytes, MaxUploadParts, c.PartSize)
	}
	return c, nil
}
