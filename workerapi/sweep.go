package workerapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/lease"
)

// sweepBatch bounds the objects one sweep lists.
const sweepBatch = 10000

// sweepCursor is where the next sweep of this Server starts listing: the
// last key the previous one listed, "" from the start.
type sweepCursor struct {
	mu    sync.Mutex
	after string
}

// sweepArtifacts runs SweepArtifacts when Config.Artifacts.SweepInterval
// has passed since this Server's last sweep.
func (s *Server) sweepArtifacts(ctx context.Context) error {
	if s.cfg.Artifacts.Store == nil {
		return nil
	}
	now := s.now()
	if last := s.swept.Load(); last != 0 && now.Sub(time.Unix(0, last)) < s.cfg.Artifacts.SweepInterval {
		return nil
	}
	s.swept.Store(now.UnixNano())
	n, err := s.SweepArtifacts(ctx)
	if n > 0 {
		s.log.Info("swept artifact objects", "objects", n)
	}
	return err
}

// SweepArtifacts deletes, from Config.Artifacts.Store, the objects of
// jobs that no longer exist (retention deleted them), and those of
// uploads that no artifact records and whose newest object is older than
// Config.Artifacts.UploadTTL (their id has expired: they can never be
// finished). It lists at most 10,000 objects per call, going on where
// the previous call stopped, and returns how many objects it deleted.
// The maintainer calls it every Config.Artifacts.SweepInterval; replicas
// may sweep at once, as deleting is idempotent.
func (s *Server) SweepArtifacts(ctx context.Context) (int, error) {
	st := s.cfg.Artifacts.Store
	if st == nil {
		return 0, nil
	}
	s.cursor.mu.Lock()
	defer s.cursor.mu.Unlock()
	type dir struct {
		newest time.Time
		keys   []string
	}
	// uploads[job dir][upload dir]
	uploads := map[string]map[string]*dir{}
	var jobs []string
	listed, last := 0, ""
	for o, err := range st.List(ctx, "jobs/") {
		if err != nil {
			return 0, err
		}
		if o.Key <= s.cursor.after {
			continue
		}
		if listed >= sweepBatch {
			break
		}
		listed++
		last = o.Key
		job, rest, ok := strings.Cut(strings.TrimPrefix(o.Key, "jobs/"), "/")
		up, _, _ := strings.Cut(rest, "/")
		if !ok || up == "" {
			continue // not an object the Server wrote
		}
		if uploads[job] == nil {
			uploads[job] = map[string]*dir{}
			jobs = append(jobs, job)
		}
		d := uploads[job][up]
		if d == nil {
			d = &dir{}
			uploads[job][up] = d
		}
		d.keys = append(d.keys, o.Key)
		if o.ModTime.After(d.newest) {
			d.newest = o.ModTime
		}
	}
	if listed < sweepBatch {
		last = "" // the listing ended: the next sweep starts over
	}
	s.cursor.after = last

	now := s.now()
	deleted := 0
	var errs []error
	del := func(keys []string) {
		for _, k := range keys {
			if err := st.Delete(ctx, k); err != nil {
				errs = append(errs, err)
				continue
			}
			deleted++
		}
	}
	for _, jd := range jobs {
		jobID, ok := jobOfDir(jd)
		if !ok {
			continue
		}
		_, err := s.leases.Get(ctx, jobID)
		if errors.Is(err, lease.ErrNotFound) {
			for _, d := range uploads[jd] {
				del(d.keys)
			}
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		as, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: jobID, Limit: maxArtifactsPerJob + 1})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recorded := map[string]bool{}
		for _, a := range as {
			recorded[a.Object] = true
		}
		for up, d := range uploads[jd] {
			if !recorded["jobs/"+jd+"/"+up+"/"] && now.Sub(d.newest) > s.cfg.Artifacts.UploadTTL {
				del(d.keys)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return deleted, fmt.Errorf("workerapi: sweeping artifacts: %w", err)
	}
	return deleted, nil
}
