package bunstore

import (
	"context"
	"fmt"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/credential"
)

// chargeQuota counts a charge in one statement: the row is created, or
// its window restarted when it ended (window_start <= now - window), or
// its units grown only while they stay within the limit. Of concurrent
// charges of one quota, PostgreSQL makes all but the first wait on the
// row and then re-checks the WHERE against the committed row; SQLite runs
// one writer at a time. No row comes back when the charge does not fit.
const chargeQuota = `INSERT INTO nodelane_quotas (principal_id, name, window_start, used)
VALUES (?0, ?1, ?2, ?3)
ON CONFLICT (principal_id, name) DO UPDATE SET
  window_start = CASE WHEN nodelane_quotas.window_start <= ?2 - ?5 THEN excluded.window_start ELSE nodelane_quotas.window_start END,
  used = CASE WHEN nodelane_quotas.window_start <= ?2 - ?5 THEN excluded.used ELSE nodelane_quotas.used + excluded.used END
WHERE nodelane_quotas.window_start <= ?2 - ?5 OR nodelane_quotas.used + excluded.used <= ?4
RETURNING window_start, used`

// ChargeQuota implements credential.Store, in one round trip when the
// charge fits and two when it does not (the second reads the window that
// refused it).
func (s *CredentialStore) ChargeQuota(ctx context.Context, c credential.QuotaCharge) (credential.Quota, bool, error) {
	var (
		start, used int64
		ok          bool
	)
	err := s.db.retryOwnTx(ctx, func() error {
		return s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
			err := idb.NewRaw(chargeQuota, c.PrincipalID, c.Name, micros(c.Now), c.N, c.Limit, c.Window.Microseconds()).
				Scan(ctx, &start, &used)
			if ok = err == nil; !isNoRows(err) {
				return err
			}
			return idb.NewSelect().TableExpr("nodelane_quotas").Column("window_start", "used").
				Where("principal_id = ?", c.PrincipalID).Where("name = ?", c.Name).Scan(ctx, &start, &used)
		})
	})
	if err != nil {
		return credential.Quota{}, false, fmt.Errorf("bunstore: charge quota %s of %s: %w", c.Name, c.PrincipalID, markAborted(err, credential.ErrAborted))
	}
	return credential.Quota{Start: fromMicros(start), Used: used}, ok, nil
}
