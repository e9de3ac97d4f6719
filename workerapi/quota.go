package workerapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
)

// Quotas of what a node writes that is never deleted: its node_audit
// receipts are counted per node and per hour in the credential store
// (credential.Issuer.Charge), in the transaction that mints them, so the
// count holds across replicas; a node awaiting approval mints none.

// The defaults of Config's least-privilege settings for nodes.
const (
	// DefaultProvisioningTokenTTL and DefaultProvisioningRegistrations
	// are the defaults of Config.ProvisioningTokenTTL and
	// Config.ProvisioningRegistrations: the provisioning token Bootstrap
	// mints lives a day and registers at most 100 nodes.
	DefaultProvisioningTokenTTL      = 24 * time.Hour
	DefaultProvisioningRegistrations = 100
	// DefaultAuditReceiptsPerHour is the default of
	// Config.AuditReceiptsPerHour.
	DefaultAuditReceiptsPerHour = 1000
)

// auditQuota names the quota of node_audit receipts.
const auditQuota = "node_audit"

// chargeAudit admits n audit receipts of worker w: ErrApprovalPending
// while w awaits its first approval, a *credential.QuotaError (429
// quota_exceeded) past Config.AuditReceiptsPerHour; otherwise it counts
// them, in the caller's transaction.
func (s *Server) chargeAudit(ctx context.Context, w *lease.Worker, n int) error {
	if w.Approval.Pending {
		return fmt.Errorf("%w: worker %s mints no audit receipt until approved", ErrApprovalPending, w.ID)
	}
	_, err := s.issuer.Charge(ctx, w.ID, auditQuota, int64(n), s.cfg.AuditReceiptsPerHour, time.Hour)
	return err
}

// retryAfter is the Retry-After of a 429 or 503 answer to err: the whole
// seconds until the quota that refused it is whole again, else 1.
func (s *Server) retryAfter(err error) string {
	var qe *credential.QuotaError
	if errors.As(err, &qe) {
		if d := qe.ResetAt.Sub(s.now()); d > time.Second {
			return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
		}
	}
	return "1"
}
