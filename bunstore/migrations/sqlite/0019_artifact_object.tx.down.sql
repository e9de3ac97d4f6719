ALTER TABLE nodelane_artifacts DROP COLUMN part_size;
--bun:split
ALTER TABLE nodelane_artifacts DROP COLUMN object;
