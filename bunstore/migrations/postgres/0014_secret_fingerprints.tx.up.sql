-- A fingerprint of each secret the replicas of one control plane must
-- share (package fingerprint): a credential pepper per version (kind
-- pepper, id the version), the receipt signing key (kind receipt_key,
-- id ''). The first replica's row wins; every replica compares its own
-- secrets with the rows at startup. A fingerprint reveals nothing about
-- its secret. created_at is unix microseconds (UTC).
CREATE TABLE IF NOT EXISTS nodelane_secret_fingerprints (
    kind        TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    PRIMARY KEY (kind, id)
);
