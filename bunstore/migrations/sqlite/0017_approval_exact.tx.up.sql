-- Whether a worker's approval is exact (lease.Approval.Exact): its
-- approved_job_types and approved_tags are the whole of what the operator
-- approved, and NULL (none) approves none. Approvals stored before this
-- migration are not exact: their NULL lists pin nothing, as before.
ALTER TABLE nodelane_workers ADD COLUMN approval_exact INTEGER NOT NULL DEFAULT 0;
