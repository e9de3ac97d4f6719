package workerapi

// SmallParts lets a test set c.PartSize below MinPartSize, so that a
// few kilobytes upload in several parts.
func SmallParts(c *ArtifactConfig) { c.smallParts = true }
