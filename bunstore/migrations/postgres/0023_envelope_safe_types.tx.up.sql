-- The job types an operator made safe at run time (POST
-- /operator/envelope/safe-types), space-separated and sorted ('' for
-- none), in the current state and in each history record; and, on a
-- safe-types record, whether the runtime was active before it (such a
-- change leaves the activation as it was). The DEFAULTs fill the rows
-- already stored; bun always writes these columns (they are not
-- pointers), so a DEFAULT never stands for a NULL.
ALTER TABLE nodelane_envelope ADD COLUMN safe_types TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE nodelane_envelope_history ADD COLUMN safe_types TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE nodelane_envelope_history ADD COLUMN was_active BOOLEAN NOT NULL DEFAULT false;
