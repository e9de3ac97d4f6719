-- Where an artifact's bytes are stored (lease.Artifact.Object and
-- PartSize): the key prefix of its parts in the host's artifact store,
-- '' for an artifact that is metadata only, and the size of each part but
-- the last.
ALTER TABLE nodelane_artifacts ADD COLUMN object TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE nodelane_artifacts ADD COLUMN part_size INTEGER NOT NULL DEFAULT 0;
