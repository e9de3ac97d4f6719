DROP TABLE IF EXISTS nodelane_envelope_history;
--bun:split
DROP TABLE IF EXISTS nodelane_envelope;
