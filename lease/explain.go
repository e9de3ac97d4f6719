package lease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Bounds on what one explanation reads, so that asking why costs about as
// much as one lease call and never scans a whole fleet or queue.
const (
	// ExplainMaxWorkers is how many registered workers Explain examines,
	// the first in id order (one Store.ListWorkers call). Each one that
	// matches the job costs at most two more reads: its ban (through
	// ExplainOptions.Banned) and its live leases (one Store.ListJobs).
	ExplainMaxWorkers = 1000
	// ExplainMaxTypes is how many distinct job types ExplainLease examines,
	// in the order the request lists them.
	ExplainMaxTypes = 64
	// ExplainMaxJobsPerType is how many queued jobs of each type
	// ExplainLease examines, the first in id order (one Store.ListJobs
	// call per type).
	ExplainMaxJobsPerType = 100
)

// ReasonCode names one reason why a job is not leasable, or why a worker
// leases nothing. Codes are stable: callers may switch on them, render
// their own text, or send them over the wire.
type ReasonCode string

// Reasons about the job itself (Explain).
const (
	// ReasonJobLeased means the job is leased or running under a worker's lease.
	ReasonJobLeased ReasonCode = "job_leased"
	// ReasonJobFinished means the job ended succeeded, failed or canceled.
	ReasonJobFinished ReasonCode = "job_finished"
	// ReasonCancelRequested means the job is live and its cancel was requested,
	// so it ends canceled and is never leased again.
	ReasonCancelRequested ReasonCode = "cancel_requested"
	// ReasonScheduled means the job (or, in ExplainLease, every fitting job of a
	// type) is scheduled later, after a retry's backoff or because it was
	// enqueued with a later ScheduledAt.
	ReasonScheduled ReasonCode = "job_scheduled"
)

// Reasons about one worker against one job's requirements, in matching
// order: a worker is judged by the first it fails.
const (
	// ReasonNoWorker means no worker is registered (Explain only).
	ReasonNoWorker ReasonCode = "no_worker"
	// ReasonJobType means the worker does not support the job type.
	ReasonJobType ReasonCode = "job_type"
	// ReasonGPUSKU means the worker has no GPU of the job's SKU.
	ReasonGPUSKU ReasonCode = "gpu_sku"
	// ReasonSKUNotOffered means the worker has GPUs of the job's SKU but did not
	// offer that SKU in its lease request (ExplainLease only).
	ReasonSKUNotOffered ReasonCode = "gpu_sku_not_offered"
	// ReasonGPUCount means the worker has fewer GPUs (of the job's SKU, among
	// those offered) than the job needs.
	ReasonGPUCount ReasonCode = "gpu_count"
	// ReasonVRAM means the worker's GPUs have too little VRAM for the job.
	ReasonVRAM ReasonCode = "vram"
	// ReasonMaxVRAM means the GPUs have the VRAM, but the worker's governor
	// max_vram_mb caps it below what the job needs.
	ReasonMaxVRAM ReasonCode = "max_vram"
	// ReasonTagsMismatch means the worker's GPUs fit the job, but it lacks one
	// of the job's Requirements.Tags among its effective tags (those it
	// registered, narrowed by what its approval pins: Worker.EffectiveTags).
	ReasonTagsMismatch ReasonCode = "tags_mismatch"
	// ReasonBanned means the worker is banned (as ExplainOptions.Banned says).
	ReasonBanned ReasonCode = "banned"
	// ReasonMaxJobs means the worker holds as many live leases as its governor
	// max_jobs allows, or as Config.MaxLeasesPerWorker allows any worker.
	ReasonMaxJobs ReasonCode = "max_jobs"
	// ReasonTypeNotApproved means the worker registered the job type, but the
	// operator's approval pins other types (see Approval). In Explain it
	// ranks with ReasonJobType as a matching step.
	ReasonTypeNotApproved ReasonCode = "type_not_approved"
	// ReasonPendingApproval means the worker awaits an operator's approval
	// (see Approval), so it is granted nothing.
	ReasonPendingApproval ReasonCode = "pending_approval"
	// ReasonWorkerOffline means the worker is offline (Manager.Liveness): it
	// stopped heartbeating, and no job is counted on it.
	ReasonWorkerOffline ReasonCode = "worker_offline"
)

// Reasons about a worker's lease request (ExplainLease).
const (
	// ReasonNoJobTypes means the request names no job type and the worker
	// registered none.
	ReasonNoJobTypes ReasonCode = "no_job_types"
	// ReasonTypeNotRegistered means the request names a job type the worker did
	// not register; it is ignored, since a request narrows the worker's
	// registered types and never widens them.
	ReasonTypeNotRegistered ReasonCode = "type_not_registered"
	// ReasonTypeNotAllowed means LeaseRequest.Allow refuses the type (in
	// nodelane, the envelope blocks it; the caller knows the policy's
	// wording and may render its own).
	ReasonTypeNotAllowed ReasonCode = "type_not_allowed"
	// ReasonNoQueuedJob means no job of the type is queued.
	ReasonNoQueuedJob ReasonCode = "no_queued_job"
	// ReasonNoFittingJob means jobs of the type are queued, but none of those
	// examined fits the worker's GPUs (as offered) and tags.
	ReasonNoFittingJob ReasonCode = "no_fitting_job"
)

// Reason is one reason, with a message for people. Messages may change
// wording; codes do not.
type Reason struct {
	Code    ReasonCode `json:"code"`
	Message string     `json:"message"`
	// JobType is the job type a per-type reason of ExplainLease is about
	// (ReasonTypeNotRegistered, ReasonTypeNotApproved, ReasonTypeNotAllowed,
	// ReasonNoQueuedJob, ReasonNoFittingJob, ReasonScheduled); empty
	// otherwise.
	JobType string `json:"job_type,omitempty"`
}

func (r Reason) String() string { return r.Message }

// ExplainOptions are the optional inputs of Explain and ExplainLease. A
// nil *ExplainOptions means all defaults.
type ExplainOptions struct {
	// Banned reports whether a worker is banned. Package lease keeps no
	// bans (package credential does), so the caller supplies them; it is
	// asked only about workers that match the job. Defaults to none banned.
	Banned func(ctx context.Context, workerID string) (bool, error)
	// AllWorkers makes Explain check the ban and the governor slot of
	// every matching worker it examines. Defaults to false: it stops at
	// the first matching worker that could take the job now, which is
	// enough to say whether the job is leasable and bounds the reads when
	// many workers match.
	AllWorkers bool
	// Job, when the caller has just read or written the job (a dispatch
	// has), is that job, which Explain then judges rather than read it
	// again. Its ID must be the jobID asked about (ErrInvalidArgument).
	Job *Job
}

// Explanation says whether a job is leasable now and, if not, why.
type Explanation struct {
	// Job is the job as read.
	Job *Job `json:"job"`
	// Leasable reports that the job is queued and due, and that a worker
	// examined matches it, is online or stale (not offline), is not banned
	// and has a free governor slot: that worker could take it at its next
	// poll, as it registered it (a worker that polls offering fewer types
	// or SKUs, or no longer polls, may still leave it waiting). It does not
	// mean the job is next in line: higher priorities and older jobs go
	// first.
	Leasable bool `json:"leasable"`
	// Reasons are why the job is not leasable, the most decisive first;
	// empty when Leasable. For a queued job they come in this order, each
	// present when it holds:
	//
	//  1. no worker examined matches the job: one summary reason, coded as
	//     the furthest matching step a worker reached (ReasonNoWorker,
	//     ReasonJobType, ReasonGPUSKU, ReasonGPUCount, ReasonVRAM,
	//     ReasonMaxVRAM when some worker's GPUs have the VRAM but its
	//     governor caps it, or ReasonTagsMismatch when workers fit all but
	//     the job's tags), naming the requirement none meets;
	//  2. ReasonScheduled, with the time;
	//  3. workers match but none could take the job now: ReasonBanned when
	//     every one of them is banned, ReasonPendingApproval when every one
	//     is banned or pending, ReasonWorkerOffline ("no online worker
	//     matches") when every one is offline, banned or pending, else
	//     ReasonMaxJobs.
	//
	// For a job in another state: ReasonJobLeased or ReasonJobFinished,
	// then ReasonCancelRequested when it applies; no worker is examined.
	Reasons []Reason `json:"reasons"`
	// Workers are the verdicts on the workers examined, in id order; nil
	// unless the job is queued.
	Workers []WorkerVerdict `json:"workers"`
	// Truncated reports that more than ExplainMaxWorkers workers are
	// registered and only the first were examined, so a job reported not
	// leasable may still be leasable by one of the others. The summary
	// reasons then say so.
	Truncated bool `json:"truncated"`
}

// WorkerVerdict is Explain's judgement of one registered worker.
type WorkerVerdict struct {
	WorkerID string `json:"worker_id"`
	NodeID   string `json:"node_id"`
	// Matches reports that the worker's registered job types, GPUs and
	// tags fit the job, as Lease would match them (Requirements.Matches on
	// Worker.Fits, within its governor max_vram_mb, and
	// Requirements.TagsMatch on Worker.EffectiveTags).
	Matches bool `json:"matches"`
	// Checked reports that the worker's ban and governor slot were
	// checked. Only matching workers are checked, and, unless
	// ExplainOptions.AllWorkers, only until one could take the job.
	Checked bool `json:"checked"`
	// Pending reports that the worker awaits an operator's approval (set
	// only when Checked); its ban and slot are not checked then.
	Pending bool `json:"pending"`
	// Draining reports that an operator asked the worker to drain
	// (Worker.Drain): it is granted nothing while the request stands.
	Draining bool `json:"draining"`
	// Offline reports that the worker is offline (set only when Checked
	// and not Pending); its ban and slot are not checked then.
	Offline bool `json:"offline"`
	Banned  bool `json:"banned"`
	// LiveLeases counts the worker's live leases that are still within
	// their TTL and accept deadline (a lease past them is expired by the
	// next Lease call before it claims); ExpiredLeases counts the others.
	// Both are set only when Checked and not Banned.
	LiveLeases    int `json:"live_leases"`
	ExpiredLeases int `json:"expired_leases"`
	// MaxJobs is how many live leases the worker may hold, as the Manager
	// applies it (Manager.MaxLeases: its governor max_jobs, at least 1, and
	// at most Config.MaxLeasesPerWorker).
	MaxJobs int `json:"max_jobs"`
	// Slot reports LiveLeases < MaxJobs (set only when Checked and not Banned).
	Slot bool `json:"slot"`
	// Available reports that the worker could take the job now: it
	// matches, was checked, is not offline, not banned and has a slot.
	Available bool `json:"available"`
	// GPUs is how many of the worker's GPUs the job may use (those of its
	// SKU, or all when it names none); VRAMMB the VRAM each of the best
	// Requirements.GPUCount of them offers, capped by the governor
	// max_vram_mb (0 when there are too few or the job needs no GPU).
	// Both are zero for a worker that does not support the job type.
	GPUs   int `json:"gpus"`
	VRAMMB int `json:"vram_mb"`
	// Reasons are why this worker cannot take the job: the first matching
	// step it fails (ReasonJobType, ReasonTypeNotApproved, ReasonGPUSKU,
	// ReasonGPUCount, ReasonVRAM, ReasonMaxVRAM, ReasonTagsMismatch), else
	// ReasonPendingApproval, ReasonDraining, ReasonWorkerOffline, ReasonBanned
	// or ReasonMaxJobs. Empty for an available worker and for one not
	// checked. Job-side reasons (ReasonScheduled) are not repeated here.
	Reasons []Reason `json:"reasons"`
}

// Explain says whether the job jobID is leasable now and, if not, why: the
// job's own state and schedule, and for each registered worker (at most
// ExplainMaxWorkers) whether it matches the job (type, GPU SKU, GPU count,
// VRAM per GPU, governor max_vram_mb, tags), is banned, and has a free
// governor slot (max_jobs against its live leases). It writes nothing,
// and does not expire leases: it judges them as the next Lease would,
// after its expiry. It does not consult any job-type policy (the
// envelope): callers that gate types check them first. It reads the job
// (unless opts.Job gives it), one page of at most ExplainMaxWorkers
// workers (or reuses the page it read within Config.ExplainWorkersTTL),
// and for each matching worker it checks its ban and its live leases (one
// Store.ListJobs, or one count of them all from a LeaseCounter).
// ErrNotFound if there is no such job.
func (m *Manager) Explain(ctx context.Context, jobID string, opts *ExplainOptions) (*Explanation, error) {
	var o ExplainOptions
	if opts != nil {
		o = *opts
	}
	j := o.Job
	if j == nil {
		var err error
		if j, err = m.store.GetJob(ctx, jobID); err != nil {
			return nil, err
		}
	} else if j.ID != jobID {
		return nil, fmt.Errorf("%w: ExplainOptions.Job is %s, not %s", ErrInvalidArgument, j.ID, jobID)
	}
	now := m.now()
	ex := &Explanation{Job: j, Reasons: []Reason{}}
	if j.State != StateQueued {
		ex.Reasons = notQueued(j, now)
		return ex, nil
	}
	ws, err := m.explainWorkers(ctx, now)
	if err != nil {
		return nil, err
	}
	if len(ws) > ExplainMaxWorkers {
		ws, ex.Truncated = ws[:ExplainMaxWorkers], true
	}
	ex.Workers = make([]WorkerVerdict, len(ws))
	var matching []int
	for i, w := range ws {
		v := &ex.Workers[i]
		*v = WorkerVerdict{WorkerID: w.ID, NodeID: w.NodeID, MaxJobs: m.MaxLeases(w), Reasons: []Reason{}}
		if !slices.Contains(w.Capabilities.JobTypes, j.Type) {
			v.Reasons = append(v.Reasons, Reason{Code: ReasonJobType, Message: fmt.Sprintf("the worker does not support job type %q", j.Type)})
			continue
		}
		if !w.Approval.allows(j.Type) {
			v.Reasons = append(v.Reasons, Reason{Code: ReasonTypeNotApproved, Message: fmt.Sprintf("the worker's approval does not include job type %q (pending until an operator approves the worker again)", j.Type)})
			continue
		}
		f := judge(w, j.Requirements, nil)
		v.GPUs, v.VRAMMB = f.gpus, f.vram
		if f.code != "" {
			v.Reasons = append(v.Reasons, f.reason(w, j.Requirements))
			continue
		}
		v.Matches = true
		matching = append(matching, i)
	}
	// One count of every matching worker's leases, when the store can:
	// otherwise each worker checked reads its jobs (liveLeases).
	var counts map[string]LeaseCount
	if lc, ok := m.store.(LeaseCounter); ok && len(matching) > 0 {
		ids := make([]string, len(matching))
		for k, i := range matching {
			ids[k] = ws[i].ID
		}
		if counts, err = lc.CountLeases(ctx, ids, now); err != nil {
			return nil, err
		}
	}
	available, banned, pending, offline, draining := false, 0, 0, 0, 0
	for _, i := range matching {
		if available && !o.AllWorkers {
			break
		}
		v := &ex.Workers[i]
		v.Checked = true
		if ws[i].Approval.Pending {
			v.Pending = true
			v.Reasons = append(v.Reasons, Reason{Code: ReasonPendingApproval, Message: "the worker awaits an operator's approval"})
			pending++
			continue
		}
		if ws[i].Drain != nil {
			v.Draining = true
			v.Reasons = append(v.Reasons, Reason{Code: ReasonDraining, Message: "an operator asked the worker to drain"})
			draining++
			continue
		}
		if m.livenessAt(ws[i], now) == LivenessOffline {
			v.Offline = true
			v.Reasons = append(v.Reasons, Reason{Code: ReasonWorkerOffline,
				Message: "the worker is offline: last seen " + ws[i].LastSeenAt.Format(time.RFC3339)})
			offline++
			continue
		}
		if o.Banned != nil {
			b, err := o.Banned(ctx, v.WorkerID)
			if err != nil {
				return nil, err
			}
			if b {
				v.Banned = true
				v.Reasons = append(v.Reasons, Reason{Code: ReasonBanned, Message: "the worker is banned"})
				banned++
				continue
			}
		}
		if counts != nil {
			v.LiveLeases, v.ExpiredLeases = counts[v.WorkerID].Live, counts[v.WorkerID].Expired
		} else if v.LiveLeases, v.ExpiredLeases, err = m.liveLeases(ctx, v.WorkerID, now); err != nil {
			return nil, err
		}
		if v.Slot = v.LiveLeases < v.MaxJobs; !v.Slot {
			v.Reasons = append(v.Reasons, m.maxJobsReason(ws[i], v.LiveLeases))
			continue
		}
		v.Available, available = true, true
	}

	among := ""
	if ex.Truncated {
		among = fmt.Sprintf(" (only the first %d registered workers were examined)", ExplainMaxWorkers)
	}
	if len(matching) == 0 {
		r := shortfall(j, ex.Workers)
		r.Message += among
		ex.Reasons = append(ex.Reasons, r)
	}
	if j.ScheduledAt.After(now) {
		ex.Reasons = append(ex.Reasons, scheduled(j))
	}
	if len(matching) > 0 && !available {
		awaiting := ""
		if pending > 0 {
			awaiting = fmt.Sprintf(", %d awaiting approval", pending)
		}
		switch {
		case banned == len(matching):
			ex.Reasons = append(ex.Reasons, Reason{Code: ReasonBanned,
				Message: fmt.Sprintf("every worker that can run it is banned (%d)", banned) + among})
		case banned+pending == len(matching):
			ex.Reasons = append(ex.Reasons, Reason{Code: ReasonPendingApproval,
				Message: fmt.Sprintf("every worker that can run it awaits an operator's approval (%d pending, %d banned)", pending, banned) + among})
		case banned+pending+draining == len(matching):
			ex.Reasons = append(ex.Reasons, Reason{Code: ReasonDraining,
				Message: fmt.Sprintf("every worker that can run it is draining at an operator's request (%d draining, %d pending, %d banned)", draining, pending, banned) + among})
		case banned+pending+draining+offline == len(matching):
			ex.Reasons = append(ex.Reasons, Reason{Code: ReasonWorkerOffline,
				Message: fmt.Sprintf("no online worker matches: every worker that can run it is offline (%d offline, %d banned, %d pending)", offline, banned, pending) + among})
		default:
			if offline > 0 {
				awaiting += fmt.Sprintf(", %d offline", offline)
			}
			if draining > 0 {
				awaiting += fmt.Sprintf(", %d draining", draining)
			}
			ex.Reasons = append(ex.Reasons, Reason{Code: ReasonMaxJobs,
				Message: fmt.Sprintf("every worker that can run it is at its governor max_jobs (%d busy, %d banned%s): it waits for a free slot",
					len(matching)-banned-pending-offline-draining, banned, awaiting) + among})
		}
	}
	ex.Leasable = len(ex.Reasons) == 0
	return ex, nil
}

// notQueued gives the reasons of a job that is not queued.
func notQueued(j *Job, now time.Time) []Reason {
	var out []Reason
	if l := j.Lease; j.State.Live() && l != nil {
		msg := fmt.Sprintf("the job is %s under the lease of worker %s (epoch %d)", j.State, l.WorkerID, l.Epoch)
		if !now.Before(l.ExpiresAt) || (j.State == StateLeased && !now.Before(l.AcceptBy)) {
			msg += "; the lease is past its deadline and the next expiry ends it"
		}
		out = append(out, Reason{Code: ReasonJobLeased, Message: msg})
	} else {
		out = append(out, Reason{Code: ReasonJobFinished, Message: fmt.Sprintf("the job ended %s", j.State)})
	}
	if j.CancelRequested && j.State.Live() {
		out = append(out, Reason{Code: ReasonCancelRequested, Message: "its cancel was requested: the job ends canceled and is not leased again"})
	}
	return out
}

func scheduled(j *Job) Reason {
	why := ""
	if j.Attempt > 1 {
		why = " (a retry's backoff)"
	}
	return Reason{Code: ReasonScheduled,
		Message: "scheduled for " + j.ScheduledAt.Format(time.RFC3339Nano) + why + ": not leasable before then"}
}

// maxJobsReason says that w, holding live leases, has no free slot.
func (m *Manager) maxJobsReason(w *Worker, live int) Reason {
	limit := m.MaxLeases(w)
	if limit < max(w.Governor.MaxJobs, 1) {
		return Reason{Code: ReasonMaxJobs, Message: fmt.Sprintf("the worker holds %d live leases; the control plane allows any worker %d, below its governor's max_jobs of %d",
			live, limit, w.Governor.MaxJobs)}
	}
	if live > limit {
		return Reason{Code: ReasonMaxJobs, Message: fmt.Sprintf("the worker holds %d live leases, over its governor's max_jobs of %d", live, limit)}
	}
	return Reason{Code: ReasonMaxJobs, Message: fmt.Sprintf("the worker holds %d live leases, its governor's max_jobs", limit)}
}

// liveLeases counts a worker's live leases that are within their TTL and
// accept deadline, and those past them.
func (m *Manager) liveLeases(ctx context.Context, workerID string, now time.Time) (live, expired int, err error) {
	jobs, err := m.store.ListJobs(ctx, JobFilter{WorkerID: workerID, Limit: maxListPage})
	if err != nil {
		return 0, 0, err
	}
	for _, j := range jobs {
		l := j.Lease
		if !j.State.Live() || l == nil || l.WorkerID != workerID {
			continue
		}
		if now.Before(l.ExpiresAt) && (j.State != StateLeased || now.Before(l.AcceptBy)) {
			live++
		} else {
			expired++
		}
	}
	return live, expired, nil
}

// LeaseCounter is a Store that counts the leases of several workers in
// one call. Explain uses it, when the Store implements it, rather than
// reading the jobs of each worker it checks.
type LeaseCounter interface {
	// CountLeases returns, for each of workerIDs that holds any, its
	// leases on jobs in a live state (leased or running): Live those that
	// have not expired at now and, on a job still leased, whose accept
	// deadline has not passed; Expired the others. A worker that holds
	// none may be missing from the map.
	CountLeases(ctx context.Context, workerIDs []string, now time.Time) (map[string]LeaseCount, error)
}

// LeaseCount is a worker's leases, as LeaseCounter counts them.
type LeaseCount struct {
	Live, Expired int
}

// stepOf ranks the matching steps, for the summary of how far any worker
// got; any other code ranks 0.
var stepOf = map[ReasonCode]int{
	ReasonJobType:         1,
	ReasonTypeNotApproved: 1,
	ReasonGPUSKU:          2,
	ReasonSKUNotOffered:   2,
	ReasonGPUCount:        3,
	ReasonVRAM:            4,
	ReasonMaxVRAM:         4,
	ReasonTagsMismatch:    5,
}

// shortfall names the requirement that no worker meets: the furthest
// matching step any worker reached, with the most any worker offers there.
func shortfall(j *Job, vs []WorkerVerdict) Reason {
	r := j.Requirements
	step, mostGPUs, mostVRAM, capped := 0, 0, 0, false
	for _, v := range vs {
		c := v.Reasons[0].Code
		s := stepOf[c]
		step = max(step, s)
		if s >= 3 {
			mostGPUs = max(mostGPUs, v.GPUs)
		}
		if s == 4 {
			mostVRAM = max(mostVRAM, v.VRAMMB)
			capped = capped || c == ReasonMaxVRAM
		}
	}
	of := ""
	if r.GPUSKU != "" {
		of = fmt.Sprintf(" of SKU %q", r.GPUSKU)
	}
	switch step {
	case 0:
		return Reason{Code: ReasonNoWorker, Message: "no worker is registered"}
	case 1:
		if slices.ContainsFunc(vs, func(v WorkerVerdict) bool { return v.Reasons[0].Code == ReasonTypeNotApproved }) {
			return Reason{Code: ReasonTypeNotApproved, Message: fmt.Sprintf("no registered worker that supports job type %q is approved for it: an operator approves the worker again to allow it", j.Type)}
		}
		return Reason{Code: ReasonJobType, Message: fmt.Sprintf("no registered worker supports job type %q", j.Type)}
	case 2:
		return Reason{Code: ReasonGPUSKU, Message: fmt.Sprintf("no registered worker that supports %s has a GPU of SKU %q", j.Type, r.GPUSKU)}
	case 3:
		return Reason{Code: ReasonGPUCount, Message: fmt.Sprintf("no registered worker that supports %s has %d GPUs%s (the most is %d)", j.Type, r.GPUCount, of, mostGPUs)}
	case 5:
		fits := ""
		if r.GPUCount > 0 {
			fits = " with the GPUs it needs"
		}
		return Reason{Code: ReasonTagsMismatch, Message: fmt.Sprintf("no registered worker that supports %s%s has tags %s", j.Type, fits, strings.Join(r.Tags, ", "))}
	}
	code := ReasonVRAM
	if capped {
		code = ReasonMaxVRAM
	}
	return Reason{Code: code, Message: fmt.Sprintf("no registered worker that supports %s has %d GPUs%s with %d MiB of VRAM each, within its governor max_vram_mb (the most is %d MiB)",
		j.Type, r.GPUCount, of, r.MinVRAMMB, mostVRAM)}
}

// fit is how a job's requirements meet one worker's GPUs.
type fit struct {
	// code is the first matching step the worker fails, "" if the job fits.
	code ReasonCode
	// gpus is how many GPUs the job may use: of its SKU (any without one),
	// among those offered. vram is what each of the best of them offers,
	// within the governor's max_vram_mb; raw the same before the cap. Both
	// are zero when there are too few GPUs or the job needs none.
	gpus, vram, raw int
}

// judge matches requirements r against w's GPUs of the SKUs offered (all
// of w's when offered is empty), step by step so that a mismatch can be
// named, then against w's effective tags. Requirements.Matches on
// Worker.Fits, which Lease uses, has the last word on GPUs, and
// Requirements.TagsMatch on Worker.EffectiveTags on tags: the steps only
// name what they decided.
func judge(w *Worker, r Requirements, offered []string) fit {
	need := r.GPUCount
	if need == 0 && (r.GPUSKU != "" || r.MinVRAMMB > 0) {
		need = 1 // as Enqueue normalises it
	}
	has := false
	var vram []int
	for _, g := range w.Capabilities.GPUs {
		if r.GPUSKU != "" && g.SKU != r.GPUSKU {
			continue
		}
		has = true
		if len(offered) == 0 || slices.Contains(offered, g.SKU) {
			vram = append(vram, g.VRAMMB)
		}
	}
	f := fit{gpus: len(vram)}
	switch {
	case r.GPUSKU != "" && !has:
		f.code = ReasonGPUSKU
	case r.GPUSKU != "" && len(vram) == 0:
		f.code = ReasonSKUNotOffered
	case need > len(vram):
		f.code = ReasonGPUCount
	case need > 0:
		slices.Sort(vram)
		f.raw = vram[len(vram)-need] // the need-th largest
		f.vram = f.raw
		if w.Governor.MaxVRAMMB > 0 {
			f.vram = min(f.vram, w.Governor.MaxVRAMMB)
		}
		switch {
		case f.raw < r.MinVRAMMB:
			f.code = ReasonVRAM
		case f.vram < r.MinVRAMMB:
			f.code = ReasonMaxVRAM
		}
	}
	switch ok := r.Matches(w.Fits(offered)); {
	case ok:
		f.code = ""
	case f.code == "":
		f.code = ReasonVRAM
	}
	if f.code == "" && !r.TagsMatch(w.EffectiveTags()) {
		f.code = ReasonTagsMismatch
	}
	return f
}

// reason words f for one worker.
func (f fit) reason(w *Worker, r Requirements) Reason {
	of := ""
	if r.GPUSKU != "" {
		of = fmt.Sprintf(" of SKU %q", r.GPUSKU)
	}
	var msg string
	switch f.code {
	case ReasonGPUSKU:
		msg = fmt.Sprintf("the worker has no GPU of SKU %q", r.GPUSKU)
	case ReasonSKUNotOffered:
		msg = fmt.Sprintf("the worker did not offer its GPUs of SKU %q", r.GPUSKU)
	case ReasonGPUCount:
		msg = fmt.Sprintf("the job needs %d GPUs%s; the worker offers %d", max(r.GPUCount, 1), of, f.gpus)
	case ReasonMaxVRAM:
		msg = fmt.Sprintf("the job needs %d MiB of VRAM on each GPU; the worker's governor max_vram_mb caps it at %d MiB", r.MinVRAMMB, w.Governor.MaxVRAMMB)
	case ReasonTagsMismatch:
		has := w.EffectiveTags()
		var lacks, unpinned []string
		for _, t := range r.Tags {
			switch {
			case slices.Contains(has, t):
			case slices.Contains(w.Tags, t):
				unpinned = append(unpinned, t)
			default:
				lacks = append(lacks, t)
			}
		}
		var why []string
		if len(lacks) > 0 {
			why = append(why, "the worker lacks "+strings.Join(lacks, ", "))
		}
		if len(unpinned) > 0 {
			why = append(why, "its approval does not pin "+strings.Join(unpinned, ", "))
		}
		msg = fmt.Sprintf("the job needs tags %s; %s", strings.Join(r.Tags, ", "), strings.Join(why, "; "))
	default:
		msg = fmt.Sprintf("the job needs %d GPUs%s with %d MiB of VRAM each; the worker's best %d have %d MiB each", max(r.GPUCount, 1), of, r.MinVRAMMB, max(r.GPUCount, 1), f.raw)
	}
	return Reason{Code: f.code, Message: msg}
}

// LeaseExplanation says why a lease request leases nothing now (or that
// it would lease a job).
type LeaseExplanation struct {
	Worker *Worker `json:"worker"`
	// Leasable reports that a queued, due job of a type examined fits the
	// worker as it asked, and that the worker is not banned and has a free
	// governor slot, so the same request could lease it now (unless
	// another worker takes it first).
	Leasable bool `json:"leasable"`
	// Reasons are why the request leases nothing. A worker whose approval
	// is pending has the one reason ReasonPendingApproval, and nothing else
	// is examined. Otherwise they come in this order, each present when it
	// holds: ReasonNoJobTypes; per type examined, in the request's order,
	// one of ReasonTypeNotRegistered, ReasonTypeNotApproved,
	// ReasonTypeNotAllowed, ReasonNoQueuedJob, ReasonNoFittingJob,
	// ReasonScheduled (none for a type with a fitting job that is due);
	// ReasonBanned; ReasonMaxJobs. Per-type reasons set Reason.JobType. A
	// request may lease nothing with Reasons that do not explain it when
	// another worker took the job first.
	Reasons []Reason `json:"reasons"`
	// Types are the verdicts per distinct job type examined, in the
	// request's order (at most ExplainMaxTypes).
	Types []TypeVerdict `json:"types"`
	// Pending reports that the worker awaits an operator's approval.
	Pending bool `json:"pending"`
	// Draining reports that an operator asked the worker to drain
	// (Worker.Drain): the one reason is then ReasonDraining, and nothing
	// else is examined.
	Draining bool `json:"draining"`
	// Banned, LiveLeases, ExpiredLeases, MaxJobs and Slot are as in
	// WorkerVerdict, checked unless Pending.
	Banned        bool `json:"banned"`
	LiveLeases    int  `json:"live_leases"`
	ExpiredLeases int  `json:"expired_leases"`
	MaxJobs       int  `json:"max_jobs"`
	Slot          bool `json:"slot"`
	// Truncated reports that the request named more than ExplainMaxTypes
	// types, or that a type had more than ExplainMaxJobsPerType queued
	// jobs, and only the first were examined.
	Truncated bool `json:"truncated"`
}

// TypeVerdict is ExplainLease's judgement of one job type.
type TypeVerdict struct {
	Type string `json:"job_type"`
	// Registered is false when the worker did not register the type, and
	// Approved false when its approval pins other types: the request
	// cannot widen either, so nothing else is examined then.
	Registered bool `json:"registered"`
	Approved   bool `json:"approved"`
	// Allowed is false when LeaseRequest.Allow refused the type (or it was
	// not examined); nothing else is examined then.
	Allowed bool `json:"allowed"`
	// Queued is how many queued jobs of the type were examined (at most
	// ExplainMaxJobsPerType, the first in id order; Truncated if there
	// are more). Fitting is how many of them fit the worker's GPUs as
	// offered, and Due how many of those are due now.
	Queued    int  `json:"queued"`
	Fitting   int  `json:"fitting"`
	Due       int  `json:"due"`
	Truncated bool `json:"truncated"`
	// NextAt is the earliest time a fitting job that is not due yet
	// becomes due; zero when there is none.
	NextAt time.Time `json:"next_at,omitzero"`
	// Shortfalls counts the examined jobs that do not fit, by the first
	// matching step the worker fails (ReasonGPUSKU, ReasonSKUNotOffered,
	// ReasonGPUCount, ReasonVRAM, ReasonMaxVRAM, ReasonTagsMismatch).
	Shortfalls map[ReasonCode]int `json:"shortfalls"`
	// Reasons are the type's reasons, as in LeaseExplanation.Reasons.
	Reasons []Reason `json:"reasons"`
}

// workerList is a list of workers Explain read at a time, while the
// Manager's worker generation was gen.
type workerList struct {
	gen uint64
	at  time.Time
	ws  []*Worker
}

// explainWorkers returns the first ExplainMaxWorkers+1 workers, as read
// within Config.ExplainWorkersTTL before now, or read now. The list is
// shared: its workers must not be changed.
func (m *Manager) explainWorkers(ctx context.Context, now time.Time) ([]*Worker, error) {
	gen := m.workersGen.Load()
	if l := m.workers.Load(); l != nil && l.gen == gen && !now.Before(l.at) && now.Sub(l.at) < m.cfg.ExplainWorkersTTL {
		return l.ws, nil
	}
	ws, err := m.store.ListWorkers(ctx, WorkerFilter{Limit: ExplainMaxWorkers + 1})
	if err != nil {
		return nil, err
	}
	// A change made while the list was read is not in it: keep the list
	// only if none was.
	if m.cfg.ExplainWorkersTTL > 0 && m.workersGen.Load() == gen {
		m.workers.Store(&workerList{gen: gen, at: now, ws: ws})
	}
	return ws, nil
}

// forgetWorkers drops the list Explain reuses: a worker changed through m.
func (m *Manager) forgetWorkers() { m.workersGen.Add(1) }

// ExplainLease says why Lease(req) leases nothing now: whether the
// worker's approval is pending (then nothing else is examined or read),
// the job types it would consider (req.JobTypes, else the worker's
// registered ones; those it did not register, those its approval does not
// include and those req.Allow refuses are not leased), for each type
// whether a queued job fits the worker's GPUs of the SKUs offered
// (req.GPUSKUs, else all its own) and its effective tags, and is due, and
// whether the worker is banned (ExplainOptions.Banned) or at its governor
// max_jobs. MaxJobs, PolicyVersion and Price are ignored, as is
// ExplainOptions.AllWorkers. It reads at most 1 worker, ExplainMaxTypes
// pages of ExplainMaxJobsPerType queued jobs, and the worker's live
// leases; it writes nothing and expires nothing. ErrNotFound if the worker
// is not registered.
func (m *Manager) ExplainLease(ctx context.Context, req LeaseRequest, opts *ExplainOptions) (*LeaseExplanation, error) {
	var o ExplainOptions
	if opts != nil {
		o = *opts
	}
	w, err := m.store.GetWorker(ctx, req.WorkerID)
	if err != nil {
		return nil, err
	}
	now := m.now()
	ex := &LeaseExplanation{Worker: w, MaxJobs: m.MaxLeases(w), Reasons: []Reason{}, Types: []TypeVerdict{}}
	if w.Approval.Pending {
		ex.Pending = true
		ex.Reasons = append(ex.Reasons, Reason{Code: ReasonPendingApproval, Message: "the worker awaits an operator's approval"})
		return ex, nil
	}
	if w.Drain != nil {
		ex.Draining = true
		ex.Reasons = append(ex.Reasons, Reason{Code: ReasonDraining, Message: "an operator asked the worker to drain: it is granted no job until the drain is withdrawn (resume)"})
		return ex, nil
	}
	asked := req.JobTypes
	if len(asked) == 0 {
		asked = w.Capabilities.JobTypes
	}
	var types []string
	for _, t := range asked {
		if !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	if len(types) == 0 {
		ex.Reasons = append(ex.Reasons, Reason{Code: ReasonNoJobTypes, Message: "the worker offers no job type"})
	}
	if len(types) > ExplainMaxTypes {
		types, ex.Truncated = types[:ExplainMaxTypes], true
	}
	due := false
	for _, t := range types {
		tv, err := m.explainType(ctx, w, t, req, now)
		if err != nil {
			return nil, err
		}
		ex.Truncated = ex.Truncated || tv.Truncated
		due = due || tv.Due > 0
		ex.Reasons = append(ex.Reasons, tv.Reasons...)
		ex.Types = append(ex.Types, tv)
	}
	if o.Banned != nil {
		if ex.Banned, err = o.Banned(ctx, w.ID); err != nil {
			return nil, err
		}
	}
	if ex.Banned {
		ex.Reasons = append(ex.Reasons, Reason{Code: ReasonBanned, Message: "the worker is banned"})
	} else {
		if ex.LiveLeases, ex.ExpiredLeases, err = m.liveLeases(ctx, w.ID, now); err != nil {
			return nil, err
		}
		if ex.Slot = ex.LiveLeases < ex.MaxJobs; !ex.Slot {
			ex.Reasons = append(ex.Reasons, m.maxJobsReason(w, ex.LiveLeases))
		}
	}
	ex.Leasable = due && ex.Slot
	return ex, nil
}

func (m *Manager) explainType(ctx context.Context, w *Worker, t string, req LeaseRequest, now time.Time) (TypeVerdict, error) {
	tv := TypeVerdict{Type: t, Shortfalls: map[ReasonCode]int{}, Reasons: []Reason{}}
	if tv.Registered = slices.Contains(w.Capabilities.JobTypes, t); !tv.Registered {
		tv.Reasons = append(tv.Reasons, Reason{Code: ReasonTypeNotRegistered, JobType: t,
			Message: fmt.Sprintf("job type %q is not among the worker's registered types: ignored", t)})
		return tv, nil
	}
	if tv.Approved = w.Approval.allows(t); !tv.Approved {
		tv.Reasons = append(tv.Reasons, Reason{Code: ReasonTypeNotApproved, JobType: t,
			Message: fmt.Sprintf("job type %q is not among the types the worker's approval pins: ignored", t)})
		return tv, nil
	}
	tv.Allowed = true
	if req.Allow != nil && !req.Allow(t) {
		tv.Allowed = false
		tv.Reasons = append(tv.Reasons, Reason{Code: ReasonTypeNotAllowed, JobType: t, Message: fmt.Sprintf("job type %q is not allowed", t)})
		return tv, nil
	}
	jobs, err := m.store.ListJobs(ctx, JobFilter{State: StateQueued, Type: t, Limit: ExplainMaxJobsPerType + 1})
	if err != nil {
		return tv, err
	}
	if len(jobs) > ExplainMaxJobsPerType {
		jobs, tv.Truncated = jobs[:ExplainMaxJobsPerType], true
	}
	tv.Queued = len(jobs)
	for _, j := range jobs {
		if f := judge(w, j.Requirements, req.GPUSKUs); f.code != "" {
			tv.Shortfalls[f.code]++
			continue
		}
		tv.Fitting++
		if !j.ScheduledAt.After(now) {
			tv.Due++
		} else if tv.NextAt.IsZero() || j.ScheduledAt.Before(tv.NextAt) {
			tv.NextAt = j.ScheduledAt
		}
	}
	examined := ""
	if tv.Truncated {
		examined = fmt.Sprintf(" among the first %d queued", ExplainMaxJobsPerType)
	}
	switch {
	case tv.Queued == 0:
		tv.Reasons = append(tv.Reasons, Reason{Code: ReasonNoQueuedJob, JobType: t, Message: fmt.Sprintf("no %s job is queued", t)})
	case tv.Fitting == 0:
		tv.Reasons = append(tv.Reasons, Reason{Code: ReasonNoFittingJob, JobType: t,
			Message: fmt.Sprintf("no queued %s job fits the worker%s (%s)", t, examined, shortfalls(tv.Shortfalls))})
	case tv.Due == 0:
		tv.Reasons = append(tv.Reasons, Reason{Code: ReasonScheduled, JobType: t,
			Message: fmt.Sprintf("the next %s job that fits%s is scheduled for %s: not leasable before then", t, examined, tv.NextAt.Format(time.RFC3339Nano))})
	}
	return tv, nil
}

// shortfalls words the counts of jobs that do not fit, in matching order.
func shortfalls(n map[ReasonCode]int) string {
	var parts []string
	for _, s := range []struct {
		code ReasonCode
		what string
	}{
		{ReasonGPUSKU, "a GPU SKU it does not have"},
		{ReasonSKUNotOffered, "a GPU SKU it did not offer"},
		{ReasonGPUCount, "more GPUs than it offers"},
		{ReasonVRAM, "more VRAM per GPU than it has"},
		{ReasonMaxVRAM, "more VRAM per GPU than its governor max_vram_mb allows"},
		{ReasonTagsMismatch, "tags it lacks"},
	} {
		switch c := n[s.code]; c {
		case 0:
		case 1:
			parts = append(parts, "1 needs "+s.what)
		default:
			parts = append(parts, fmt.Sprintf("%d need %s", c, s.what))
		}
	}
	return strings.Join(parts, ", ")
}
