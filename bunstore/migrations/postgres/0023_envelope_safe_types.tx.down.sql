ALTER TABLE nodelane_envelope_history DROP COLUMN was_active;
--bun:split
ALTER TABLE nodelane_envelope_history DROP COLUMN safe_types;
--bun:split
ALTER TABLE nodelane_envelope DROP COLUMN safe_types;
