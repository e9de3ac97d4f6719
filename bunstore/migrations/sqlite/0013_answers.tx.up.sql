-- The first answers to worker requests sent under a key of the sender's
-- (lease.Answer): id is the SHA-256 workerapi derives from the worker, the
-- route and the key; body is sealed. Rows past expires_at are dead and
-- deleted by the maintainer through the expiry index.
CREATE TABLE IF NOT EXISTS nodelane_answers (
    id         BLOB   NOT NULL PRIMARY KEY,
    worker_id  TEXT NOT NULL,
    digest     BLOB   NOT NULL,
    status     INTEGER NOT NULL,
    body       BLOB   NOT NULL,
    created_at BIGINT  NOT NULL,
    expires_at BIGINT  NOT NULL
);
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_answers_expires_idx ON nodelane_answers (expires_at);
