package receipts

// Waiting returns how many callers of Await q holds registered, for the
// tests of package receipts_test.
func Waiting(q *Sequencer) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}
