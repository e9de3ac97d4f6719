-- The credential package's tables. Times are unix microseconds (UTC); NULL
-- in a nullable time means unset. Rows hold no token and no secret: a
-- credential keeps only the keyed digest of its secret (DESIGN §4).
-- Ids collate as "C", byte order, as in Go and SQLite. No column has a
-- DEFAULT: bun writes a nil pointer as DEFAULT on PostgreSQL, and that
-- must mean NULL. No foreign key from credentials to principals: the
-- store applies what the Issuer decided, as the memory store does, and a
-- violation would abort the caller's transaction.
CREATE TABLE IF NOT EXISTS nodelane_principals (
    id         TEXT    COLLATE "C" NOT NULL PRIMARY KEY,
    kind       TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    -- A node's Ed25519 public key (32 raw bytes); NULL without one.
    public_key BYTEA,
    key_id     TEXT    NOT NULL,
    banned     BOOLEAN NOT NULL,
    ban_reason TEXT    NOT NULL,
    banned_at  BIGINT,
    created_at BIGINT  NOT NULL,
    rev        BIGINT  NOT NULL
);
--bun:split
-- scopes are the credential's scopes in order, separated by one space (as
-- an OAuth scope string); digest is HMAC-SHA256 of the secret under the
-- subkey of pepper_version.
CREATE TABLE IF NOT EXISTS nodelane_credentials (
    id             TEXT    COLLATE "C" NOT NULL PRIMARY KEY,
    principal_id   TEXT    COLLATE "C" NOT NULL,
    scopes         TEXT    NOT NULL,
    digest         BYTEA   NOT NULL,
    pepper_version BIGINT  NOT NULL,
    created_at     BIGINT  NOT NULL,
    expires_at     BIGINT  NOT NULL,
    revoked_at     BIGINT,
    rotated_to     TEXT    NOT NULL,
    rev            BIGINT  NOT NULL
);
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_credentials_principal_idx ON nodelane_credentials (principal_id);
