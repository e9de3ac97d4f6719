package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxPins bounds how many job types, and how many tags, one approval
// pins; MaxPinLen bounds each one, in bytes.
// MaxApprovalReason bounds an approval's reason, in bytes. MaxJobTags
// bounds a job's Requirements.Tags, and MaxTagLen each of them, in bytes,
// by the same rules as an approval's pins.
const (
	MaxPins           = 64
	MaxPinLen         = MaxTypeLen
	MaxApprovalReason = 1024
	MaxJobTags        = MaxPins
	MaxTagLen         = MaxPinLen
)

// Approval is an operator's decision on a worker. A control plane that
// approves nodes registers a new worker Pending, and Lease grants a
// pending worker nothing until Manager.Approve approves it. An approval
// may pin the job types the worker may be granted: they narrow the types
// it registered, never widen them. It may also pin the tags the operator
// vouches for, which narrow the worker's tags in the same way: the
// worker's own Tags stay what it registered, and a job's
// Requirements.Tags are matched against those of them the approval pins
// (Worker.EffectiveTags), so a worker cannot join a pool by registering
// a tag its approval does not pin.
//
// A Store keeps a worker's Approval as SetApproval last wrote it:
// PutWorker never changes the Approval of a worker already stored, so a
// registration or heartbeat that read the worker before an approval
// cannot undo it.
type Approval struct {
	// Pending means the worker awaits an operator's approval and is granted no job.
	Pending bool `json:"pending"`
	// At is when an operator last approved the worker, nil if none ever
	// did; By is that operator (a principal id) and Reason what they gave.
	At     *time.Time `json:"approved_at"`
	By     string     `json:"approved_by"`
	Reason string     `json:"reason"`
	// JobTypes, when not empty, are the only job types the worker may be
	// granted, sorted and without duplicates. Empty pins no type.
	JobTypes []string `json:"job_types"`
	// Tags, when not empty, are the tags the operator approved, sorted and
	// without duplicates: only those of the worker's registered tags count
	// in matching (Worker.EffectiveTags). Empty pins no tag.
	Tags []string `json:"tags"`
	// Exact makes JobTypes and Tags the whole of what the operator
	// approved: a type or tag not among them is not granted, even when
	// the list is empty. Approve fills an empty list of an exact approval
	// with what the worker registered at that time, so that an approval
	// that pins nothing covers the types and tags the worker had when it
	// was approved, and a later widening (a type or tag the worker
	// registers afterwards) waits for another approval
	// (Worker.PendingApproval) while what was approved keeps working.
	// Approvals stored before the field are not exact: their empty lists
	// pin nothing.
	Exact bool `json:"exact"`
}

// Approved reports whether an operator approved the worker and it is not
// pending.
func (a Approval) Approved() bool { return a.At != nil && !a.Pending }

// allows reports whether the approval lets the worker be granted jobs of
// type t: it pins no type, or pins t.
func (a Approval) allows(t string) bool {
	return !a.Exact && len(a.JobTypes) == 0 || slices.Contains(a.JobTypes, t)
}

// allowsTag reports whether the approval lets the worker's tag t count
// in matching: it pins no tag, or pins t.
func (a Approval) allowsTag(t string) bool {
	return !a.Exact && len(a.Tags) == 0 || slices.Contains(a.Tags, t)
}

// PendingApproval returns the job types and tags w registered that its
// approval does not cover, sorted and without duplicates, nil when none:
// all of them while its approval is pending, and afterwards those an
// operator must approve before w is granted jobs of those types or
// tags (a widening since the approval). A worker never approved, and
// not pending, has none.
func (w *Worker) PendingApproval() (types, tags []string) {
	a := w.Approval
	if !a.Pending && a.At == nil {
		return nil, nil
	}
	for _, t := range w.Capabilities.JobTypes {
		if a.Pending || !a.allows(t) {
			types = append(types, t)
		}
	}
	for _, t := range w.Tags {
		if a.Pending || !a.allowsTag(t) {
			tags = append(tags, t)
		}
	}
	return sortedSet(types), sortedSet(tags)
}

// leaseTypes returns the job types a lease request of w considers: those
// it asks for (all it registered when it asks for none) that it
// registered and its approval allows, without duplicates, in the order
// asked. A type asked for but not registered is ignored: a request
// narrows what the worker registered, never widens it.
func (w *Worker) leaseTypes(asked []string) []string {
	if len(asked) == 0 {
		asked = w.Capabilities.JobTypes
	}
	var out []string
	for _, t := range asked {
		if !slices.Contains(out, t) && slices.Contains(w.Capabilities.JobTypes, t) && w.Approval.allows(t) {
			out = append(out, t)
		}
	}
	return out
}

// Approve records an operator's approval of worker workerID: it is no
// longer pending, and a.JobTypes and a.Tags (each at most MaxPins values
// of 1 to MaxPinLen bytes of UTF-8 without spaces or control characters,
// stored sorted and deduplicated; empty pins nothing) replace what an
// earlier approval pinned. With a.Exact, an empty a.JobTypes or a.Tags
// is filled with the worker's registered job types or tags at that time
// (see Approval.Exact). a.By and a.Reason (at most MaxApprovalReason
// bytes) are recorded with the time; a.Pending and a.At are ignored.
// Approving a worker already approved with the same job types and tags
// changes nothing and returns changed = false. Of two approvals at once,
// the last written stands.
// ErrInvalidArgument, ErrNotFound.
func (m *Manager) Approve(ctx context.Context, workerID string, a Approval) (w *Worker, changed bool, err error) {
	if len(a.Reason) > MaxApprovalReason {
		return nil, false, fmt.Errorf("%w: the reason is %d bytes, over the limit of %d", ErrInvalidArgument, len(a.Reason), MaxApprovalReason)
	}
	types, err := pins("job_types", a.JobTypes)
	if err != nil {
		return nil, false, err
	}
	tags, err := pins("tags", a.Tags)
	if err != nil {
		return nil, false, err
	}
	// Concurrent approvals are ordered: each is written only over the
	// approval it read, and one that lost the race reads again and
	// decides again (with the same pins as the winner, it changes
	// nothing).
	for range casTries {
		if w, err = m.store.GetWorker(ctx, workerID); err != nil {
			return nil, false, err
		}
		types, tags := types, tags
		if a.Exact && len(types) == 0 {
			types = sortedSet(w.Capabilities.JobTypes)
		}
		if a.Exact && len(tags) == 0 {
			tags = sortedSet(w.Tags)
		}
		if w.Approval.Approved() && w.Approval.Exact == a.Exact &&
			slices.Equal(w.Approval.JobTypes, types) && slices.Equal(w.Approval.Tags, tags) {
			return w, false, nil
		}
		now := m.now()
		next := Approval{At: &now, By: a.By, Reason: a.Reason, JobTypes: types, Tags: tags, Exact: a.Exact}
		err = m.store.SetApproval(ctx, w.ID, w.Approval.At, next)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		w.Approval = next
		m.forgetWorkers()
		return w, true, nil
	}
	return nil, false, fmt.Errorf("lease: approval of worker %s: %w: too many concurrent approvals", workerID, ErrConflict)
}

// pins checks the values an approval pins, or a job's tags, and returns
// them sorted and deduplicated, nil when there are none: at most MaxPins
// (MaxJobTags) values of 1 to MaxPinLen (MaxTagLen) bytes of UTF-8
// without spaces or control characters.
func pins(field string, vs []string) ([]string, error) {
	out := sortedSet(vs)
	if len(out) > MaxPins {
		return nil, fmt.Errorf("%w: %s holds %d values, more than %d", ErrInvalidArgument, field, len(out), MaxPins)
	}
	for _, v := range out {
		if v == "" || len(v) > MaxPinLen || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: each of %s must be 1 to %d bytes of UTF-8", ErrInvalidArgument, field, MaxPinLen)
		}
		for _, r := range v {
			if unicode.IsSpace(r) || unicode.IsControl(r) {
				return nil, fmt.Errorf("%w: %s value %q holds a space or a control character", ErrInvalidArgument, field, v)
			}
		}
	}
	return out, nil
}

// sortedSet returns vs sorted and without duplicates, nil when empty.
func sortedSet(vs []string) []string {
	if len(vs) == 0 {
		return nil
	}
	out := slices.Clone(vs)
	slices.Sort(out)
	return slices.Compact(out)
}
