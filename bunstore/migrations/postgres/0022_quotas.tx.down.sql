DROP TABLE IF EXISTS nodelane_quotas;
