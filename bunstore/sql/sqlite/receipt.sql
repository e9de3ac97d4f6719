-- A new receipt (receipts.Store's AddReceipts, one row a call): ?1 id, ?2 kind, ?3 body. A taken id inserts nothing.
INSERT INTO nodelane_receipts (id, kind, body) VALUES (?1, ?2, ?3) ON CONFLICT (id) DO NOTHING
