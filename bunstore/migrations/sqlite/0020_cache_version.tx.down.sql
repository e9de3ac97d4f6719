DROP TABLE IF EXISTS nodelane_cache_version;
