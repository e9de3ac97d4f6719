package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// runFleet is fleet mode: cfg.nodes nodes heartbeat every cfg.interval,
// their first heartbeats spread evenly over one interval, and the first
// cfg.longPolls of them keep a lease long-poll open, begun evenly over one
// wait, for cfg.duration.
// Nothing is dispatched: the long-polls are idle unless jobs of
// cfg.jobType are queued, in which case each job leased is released at
// once (and counted). It writes the report to out and returns
// errChecksFailed if a heartbeat or a long-poll failed.
func runFleet(ctx context.Context, cfg *config, log *slog.Logger, out io.Writer) error {
	fmt.Fprintf(out, "loadgen fleet: %d nodes heartbeating every %s, %d idle long-polls of %d s, for %s, server %s\n",
		cfg.nodes, cfg.interval, cfg.longPolls, cfg.wait, cfg.duration, cfg.server)
	stats := newRouteStats()
	ct := &countingTransport{}
	hc := httpClient(cfg, cfg.longPolls+cfg.registerN+256, ct)
	pg, err := openPG(ctx, cfg.pgDSN, cfg.pgSettle)
	if err != nil {
		return err
	}
	defer pg.close()

	nodes, pgBefore, err := enroll(ctx, cfg, hc, log, stats, pg, out)
	if err != nil {
		return err
	}
	mem := startMemSampler(cfg.serverPIDs, time.Second)

	var (
		released atomic.Int64
		wg       sync.WaitGroup
	)
	fctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	for i, n := range nodes {
		phase := cfg.interval * time.Duration(i) / time.Duration(len(nodes))
		wg.Go(func() { heartbeatLoop(fctx, n, phase, cfg.interval, stats) })
		if i < cfg.longPolls {
			// Spread over one wait as the heartbeats are over one
			// interval: long-polls begun in one instant end in one
			// instant, every wait, which is a fleet's state for a moment
			// after a restart, not its steady state.
			phase := time.Duration(cfg.wait) * time.Second * time.Duration(i) / time.Duration(cfg.longPolls)
			wg.Go(func() {
				if sleep(fctx, phase) {
					released.Add(longPollLoop(fctx, n, cfg, stats))
				}
			})
		}
	}
	<-fctx.Done()
	stopped := context.Cause(ctx) // the parent's: fctx ends at its deadline
	wg.Wait()
	memLine := mem.finish()
	var pgAfter pgCounters
	if pg != nil {
		if pgAfter, err = pg.read(ctx); err != nil {
			return err
		}
	}

	hb := stats.get(rowHeartbeat)
	fmt.Fprintf(out, "heartbeats: %d answered in %s (%.1f/s), %d failed\n", hb.n, cfg.duration, float64(hb.n)/cfg.duration.Seconds(), hb.errs)
	lp := stats.get(rowLeaseEmpty)
	fmt.Fprintf(out, "long-polls: %d answered without a job, %d failed, %d jobs leased and released", lp.n, stats.get(rowLease).errs, released.Load())
	if released.Load() > 0 {
		fmt.Fprintf(out, " (jobs of %s were queued: the long-polls were not idle)", cfg.jobType)
	}
	fmt.Fprintln(out)
	stats.print(out)
	fmt.Fprintf(out, "worker HTTP: %s\n", ct)
	fmt.Fprintln(out, memLine)
	if pg != nil {
		fmt.Fprintln(out, pgLine(pgBefore, pgAfter, hb.n, "heartbeat"))
	}
	if stopped != nil {
		fmt.Fprintf(out, "the fleet was stopped: %v\n", stopped)
		return errChecksFailed
	}
	if n := stats.errors(); n > 0 {
		fmt.Fprintf(out, "check fleet: FAILED: %d calls failed\n", n)
		return errChecksFailed
	}
	fmt.Fprintf(out, "check fleet: ok: every heartbeat and long-poll answered\n")
	return nil
}

// heartbeatLoop heartbeats as an idle node every interval, the first
// time after phase, until ctx ends. A heartbeat cut short by the end is
// not counted.
func heartbeatLoop(ctx context.Context, n *node, phase, interval time.Duration, stats *routeStats) {
	next := time.Now().Add(phase)
	for sleep(ctx, time.Until(next)) {
		start := time.Now()
		_, err := n.c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"})
		if ctx.Err() != nil {
			return
		}
		stats.add(rowHeartbeat, time.Since(start), err)
		next = next.Add(interval)
	}
}

// longPollLoop keeps a lease long-poll open until ctx ends, and returns
// how many jobs it leased and released.
func longPollLoop(ctx context.Context, n *node, cfg *config, stats *routeStats) int64 {
	var released int64
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := n.c.Lease(ctx, wire.LeaseRequest{SupportedJobTypes: []string{cfg.jobType}, MaxJobs: 1, WaitSeconds: cfg.wait})
		switch {
		case ctx.Err() != nil:
			return released
		case err != nil:
			stats.add(rowLease, time.Since(start), err)
			sleep(ctx, time.Second)
			continue
		case len(resp.Leases) == 0:
			stats.add(rowLeaseEmpty, time.Since(start), nil)
			continue
		}
		stats.add(rowLease, time.Since(start), nil)
		for _, g := range resp.Leases {
			start := time.Now()
			_, err := n.c.Release(ctx, g.Job.ID, wire.ReleaseRequest{LeaseToken: g.LeaseToken, Reason: "loadgen fleet mode runs no jobs"})
			if ctx.Err() != nil {
				return released
			}
			stats.add(rowRelease, time.Since(start), err)
			released++
		}
		// The job is queued again: wait as an idle long-poll would rather
		// than lease it again at once.
		sleep(ctx, time.Duration(max(cfg.wait, 1))*time.Second)
	}
	return released
}
