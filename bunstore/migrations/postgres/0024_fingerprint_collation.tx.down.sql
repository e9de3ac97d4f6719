ALTER TABLE nodelane_secret_fingerprints
    ALTER COLUMN kind TYPE TEXT COLLATE "default",
    ALTER COLUMN id TYPE TEXT COLLATE "default";
