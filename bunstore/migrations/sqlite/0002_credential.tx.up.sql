-- The credential package's tables. Times are unix microseconds (UTC); NULL
-- in a nullable time means unset. Rows hold no token and no secret: a
-- credential keeps only the keyed digest of its secret (DESIGN §4).
-- No foreign key from credentials to principals: the store applies what
-- the Issuer decided, as the memory store does, and a violation would be
-- a driver error rather than one of credential's sentinels.
CREATE TABLE IF NOT EXISTS nodelane_principals (
    id         TEXT    NOT NULL PRIMARY KEY,
    kind       TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    -- A node's Ed25519 public key (32 raw bytes); NULL without one.
    public_key BLOB,
    key_id     TEXT    NOT NULL,
    banned     INTEGER NOT NULL,
    ban_reason TEXT    NOT NULL,
    banned_at  INTEGER,
    created_at INTEGER NOT NULL,
    rev        INTEGER NOT NULL
) STRICT;
--bun:split
-- scopes are the credential's scopes in order, separated by one space (as
-- an OAuth scope string); digest is HMAC-SHA256 of the secret under the
-- subkey of pepper_version.
CREATE TABLE IF NOT EXISTS nodelane_credentials (
    id             TEXT    NOT NULL PRIMARY KEY,
    principal_id   TEXT    NOT NULL,
    scopes         TEXT    NOT NULL,
    digest         BLOB    NOT NULL,
    pepper_version INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    revoked_at     INTEGER,
    rotated_to     TEXT    NOT NULL,
    rev            INTEGER NOT NULL
) STRICT;
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_credentials_principal_idx ON nodelane_credentials (principal_id);
