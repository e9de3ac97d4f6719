package workerapi

import (
	"encoding/hex"
	"fmt"
	"io"
	"time"
)

// chargeSuffix makes a job_charged receipt's id from its job_completed
// receipt's: rcp_<32 hex>.charge. A completion mints both with these ids,
// so that a repeated completion, which mints nothing, finds the charge
// from the id the job stores (Job.ReceiptID is the job_completed one).
const chargeSuffix = ".charge"

// chargeID is the id of the job_charged receipt minted with the
// job_completed receipt completedID.
func chargeID(completedID string) string { return completedID + chargeSuffix }

// newReceiptID returns an id in the form receipts.Log.Mint assigns,
// "rcp_" and 32 lowercase hex digits (48 bits of milliseconds since the
// Unix epoch, then 80 random bits), for a receipt whose id must be known
// before it is minted: an artifact stores its receipt's id, and a
// completion derives its charge's id.
func newReceiptID(now time.Time, rand io.Reader) (string, error) {
	var b [16]byte
	ms := uint64(now.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	if _, err := io.ReadFull(rand, b[6:]); err != nil {
		return "", fmt.Errorf("workerapi: reading randomness: %w", err)
	}
	return "rcp_" + hex.EncodeToString(b[:]), nil
}
