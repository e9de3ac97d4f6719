package workerapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The limits of GET /operator/costs.
const (
	// maxCostRange bounds to - from.
	maxCostRange = wire.MaxCostRangeDays * 24 * time.Hour
	// maxCostScan bounds how many receipts of the log one report reads.
	maxCostScan = wire.MaxCostScanReceipts
	// maxCostGroups bounds how many groups one report answers.
	maxCostGroups = wire.MaxCostGroups
)

// costSum is what a group of job_charged receipts adds up to.
type costSum struct {
	jobs, ms, gpuMS, micros int64
}

// add adds one charge, failing on an overflow of any sum.
func (c *costSum) add(r *receipts.Receipt) error {
	if r.GPUCount != 0 && r.ActualMS > math.MaxInt64/r.GPUCount {
		return fmt.Errorf("%w: a charge's GPU time overflows", ErrInvalidRequest)
	}
	gpuMS := r.ActualMS * r.GPUCount
	if c.ms > math.MaxInt64-r.ActualMS || c.gpuMS > math.MaxInt64-gpuMS || c.micros > math.MaxInt64-r.CostMicros {
		return fmt.Errorf("%w: the sums overflow an int64", ErrInvalidRequest)
	}
	c.jobs++
	c.ms += r.ActualMS
	c.gpuMS += gpuMS
	c.micros += r.CostMicros
	return nil
}

// unbilledSum is what a group of uncharged attempts adds up to.
type unbilledSum struct {
	attempts, ms, gpuMS int64
}

// add adds one uncharged attempt, failing on an overflow of any sum.
func (u *unbilledSum) add(r *receipts.Receipt) error {
	if r.GPUCount != 0 && r.ActualMS > math.MaxInt64/r.GPUCount {
		return fmt.Errorf("%w: an attempt's GPU time overflows", ErrInvalidRequest)
	}
	gpuMS := r.ActualMS * r.GPUCount
	if u.ms > math.MaxInt64-r.ActualMS || u.gpuMS > math.MaxInt64-gpuMS {
		return fmt.Errorf("%w: the sums overflow an int64", ErrInvalidRequest)
	}
	u.attempts++
	u.ms += r.ActualMS
	u.gpuMS += gpuMS
	return nil
}

func (u unbilledSum) wire() wire.UnbilledSum {
	return wire.UnbilledSum{Attempts: u.attempts, ActualMS: u.ms, GPUMS: u.gpuMS, GPUHours: receipts.Hours(u.gpuMS)}
}

// unbilledReason is the reason an attempt's receipt counts as unbilled
// under, and whether it does: every job_failed receipt, by error_code,
// and a job_completed receipt that says it was not charged.
func unbilledReason(r *receipts.Receipt) (string, bool) {
	switch {
	case r.Kind == receipts.KindJobFailed:
		return r.ErrorCode, true
	case r.Kind == receipts.KindJobCompleted && r.Charged == receipts.ChargedNo:
		return wire.UnbilledCompleted, true
	}
	return "", false
}

func (c costSum) wire() wire.CostSum {
	return wire.CostSum{
		Jobs:         c.jobs,
		ActualMS:     c.ms,
		GPUHours:     receipts.Hours(c.gpuMS),
		CostMicroUSD: c.micros,
		CostUSD:      receipts.FormatMicros(c.micros),
	}
}

// costTime parses a from= or to= of GET /operator/costs as
// wire.ParseWhen reads it (RFC 3339, a date, or an age before now, the
// server's clock), in UTC; def when it is not given.
func costTime(q map[string][]string, name string, def, now time.Time) (time.Time, error) {
	if _, given := q[name]; !given {
		return def, nil
	}
	v, err := qString(q, name)
	if err != nil {
		return time.Time{}, err
	}
	t, err := wire.ParseWhen(v, now)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s must be an RFC 3339 time (2026-11-01T00:00:00Z), a date (2026-11-01) or an age before now (24h, 7d, 2w)", ErrInvalidRequest, name)
	}
	return t, nil
}

// opCosts sums the job_charged receipts whose server_time is in [from,
// to), by GPU SKU, worker or job type. It sequences pending receipts
// first (bounded by Config.ProofWait), then reads the log in index
// order: the totals are the sums of the receipts' own integers
// (actual_ms, and actual_cost_usd in micro-USD), so they equal the sum
// of the receipts exactly. A job's type is not on its job_charged
// receipt: it is read from the job_completed receipt minted with it
// (whose id the charge's id extends), which precedes it in the log.
// Beside the charges it sums the GPU time no one was charged for
// (wire.Unbilled): the actual_ms × gpu_count of every job_failed receipt
// of the window, and of every job_completed one that says charged "no",
// by reason (unbilledReason).
func (s *Server) opCosts(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	now := s.now().UTC()
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	from, err := costTime(q, "from", monthStart, now)
	if err != nil {
		return 0, nil, err
	}
	to, err := costTime(q, "to", now, now)
	if err != nil {
		return 0, nil, err
	}
	groupBy, err := qString(q, "group_by")
	if err != nil {
		return 0, nil, err
	}
	if _, given := q["group_by"]; !given {
		groupBy = wire.CostGroupBySKU
	}
	switch {
	case groupBy != wire.CostGroupBySKU && groupBy != wire.CostGroupByWorker && groupBy != wire.CostGroupByJobType:
		return 0, nil, fmt.Errorf("%w: group_by must be sku, worker or job_type", ErrInvalidRequest)
	case !from.Before(to):
		return 0, nil, fmt.Errorf("%w: from (%s) must be before to (%s)", ErrInvalidRequest, from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano))
	case to.Sub(from) > maxCostRange:
		return 0, nil, fmt.Errorf("%w: from and to are more than %d days apart", ErrInvalidRequest, wire.MaxCostRangeDays)
	}

	sctx, cancel := context.WithTimeout(ctx, s.cfg.ProofWait)
	_, serr := s.Sequence(sctx)
	cancel()
	if serr != nil {
		s.log.Warn("sequencing receipts for a cost report", "request_id", c.reqID, "err", serr)
	}

	groups := map[string]*costSum{}
	var total costSum
	unbilled := map[string]*unbilledSum{}
	var unbilledTotal unbilledSum
	// jobTypes maps the id of a job_completed receipt read and not yet
	// matched by its charge to its job type (group_by=job_type only).
	jobTypes := map[string]string{}
	scanned, from0 := 0, int64(0)
	for {
		rs, err := s.receipts.List(ctx, from0, maxPage)
		if err != nil {
			return 0, nil, err
		}
		if scanned += len(rs); scanned > maxCostScan {
			return 0, nil, fmt.Errorf("%w: the receipt log holds more than %d receipts, which a cost report does not read", ErrInvalidRequest, maxCostScan)
		}
		for _, st := range rs {
			if st.Kind == receipts.KindJobFailed || st.Kind == receipts.KindJobCompleted {
				r, err := st.Receipt()
				if err != nil {
					return 0, nil, err
				}
				if reason, ok := unbilledReason(r); ok && !r.ServerTime.Before(from) && r.ServerTime.Before(to) {
					u := unbilled[reason]
					if u == nil {
						if len(unbilled) == maxCostGroups {
							return 0, nil, fmt.Errorf("%w: the report has more than %d reasons of unbilled time; narrow from and to", ErrInvalidRequest, maxCostGroups)
						}
						u = &unbilledSum{}
						unbilled[reason] = u
					}
					if err := u.add(r); err != nil {
						return 0, nil, err
					}
					if err := unbilledTotal.add(r); err != nil {
						return 0, nil, err
					}
				}
				if groupBy == wire.CostGroupByJobType && st.Kind == receipts.KindJobCompleted {
					jobTypes[r.ID] = r.JobType
				}
				continue
			}
			if st.Kind != receipts.KindJobCharged {
				continue
			}
			r, err := st.Receipt()
			if err != nil {
				return 0, nil, err
			}
			completedID := strings.TrimSuffix(r.ID, chargeSuffix)
			jobType, seen := jobTypes[completedID]
			delete(jobTypes, completedID)
			if r.ServerTime.Before(from) || !r.ServerTime.Before(to) {
				continue
			}
			var key string
			switch groupBy {
			case wire.CostGroupBySKU:
				key = r.GPUSKU
			case wire.CostGroupByWorker:
				key = r.WorkerID
			case wire.CostGroupByJobType:
				if !seen {
					// Not read before its charge: minted apart from it
					// (a charge not minted by a completion of this
					// server), or out of order.
					if jobType, err = s.chargedJobType(ctx, completedID); err != nil {
						return 0, nil, err
					}
				}
				key = jobType
			}
			g := groups[key]
			if g == nil {
				if len(groups) == maxCostGroups {
					return 0, nil, fmt.Errorf("%w: the report has more than %d groups; narrow from and to", ErrInvalidRequest, maxCostGroups)
				}
				g = &costSum{}
				groups[key] = g
			}
			if err := g.add(r); err != nil {
				return 0, nil, err
			}
			if err := total.add(r); err != nil {
				return 0, nil, err
			}
		}
		if len(rs) < maxPage {
			break
		}
		from0 = rs[len(rs)-1].Index + 1
	}

	out := wire.CostReport{
		From: from, To: to, GroupBy: groupBy,
		Groups: make([]wire.CostGroup, 0, len(groups)),
		Total:  total.wire(),
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out.Groups = append(out.Groups, wire.CostGroup{Key: k, CostSum: groups[k].wire()})
	}
	out.Unbilled = wire.Unbilled{Groups: make([]wire.UnbilledGroup, 0, len(unbilled)), Total: unbilledTotal.wire()}
	for _, k := range slices.Sorted(maps.Keys(unbilled)) {
		out.Unbilled.Groups = append(out.Unbilled.Groups, wire.UnbilledGroup{Reason: k, UnbilledSum: unbilled[k].wire()})
	}
	return http.StatusOK, out, nil
}

// chargedJobType returns the job type of the job_completed receipt with
// id completedID; "" when there is none.
func (s *Server) chargedJobType(ctx context.Context, completedID string) (string, error) {
	st, err := s.receipts.Get(ctx, completedID)
	if err != nil {
		if errors.Is(err, receipts.ErrNotFound) {
			return "", nil
		}
		return "", err
	}
	r, err := st.Receipt()
	if err != nil {
		return "", err
	}
	return r.JobType, nil
}
