-- Quotas of what a principal writes that is never deleted (a node's
-- audit receipts): one row per principal and quota, its current window's
-- start (unix microseconds) and the units used in it. Apart from
-- nodelane_principals so that a charge changes no cached principal.
CREATE TABLE IF NOT EXISTS nodelane_quotas (
    principal_id TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    window_start INTEGER NOT NULL,
    used         INTEGER NOT NULL,
    PRIMARY KEY (principal_id, name)
) STRICT;
