ALTER TABLE nodelane_artifacts
    DROP COLUMN IF EXISTS object,
    DROP COLUMN IF EXISTS part_size;
