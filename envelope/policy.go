package envelope

import (
	"fmt"
	"slices"
)

// Class is how a Policy treats a job type.
type Class string

// The classes of job types.
const (
	// ClassSafe types always run.
	ClassSafe Class = "safe"
	// ClassBlocked types run only while the runtime is activated.
	ClassBlocked Class = "blocked"
	// ClassUnknown is every type the policy does not list. Unknown types
	// are treated as blocked.
	ClassUnknown Class = "unknown"
)

// SafeTypes returns the canonical safe job types, in the order
// the founding contract lists them. Each call returns a new slice.
func SafeTypes() []string {
	return []string{"status_check", "telemetry_sync", "dataset_prepare_dry_run", "embedding_dry_run"}
}

// BlockedTypes returns the canonical blocked job types, in the
// order the founding contract lists them. Each call returns a new slice.
func BlockedTypes() []string {
	return []string{
		"teacher_write_confirmed", "raw_training", "lora_train", "auto_promotion",
		"dataset_mutation", "model_file_write", "public_inbound_listener",
	}
}

// maxTypeLen bounds a job type name, as lease does.
const maxTypeLen = 128

// Policy classifies job types: the canonical ones and a host's
// additions. It never changes once built, and is safe for concurrent use.
type Policy struct {
	safe, blocked []string
	class         map[string]Class
}

// newPolicy builds the canonical policy extended by extraSafe and
// extraBlocked. A type may be in at most one class: listing a type as
// both safe and blocked, counting the canonical lists, is an error, so a
// host can never make a canonical blocked type safe.
func newPolicy(extraSafe, extraBlocked []string) (*Policy, error) {
	p := &Policy{class: make(map[string]Class)}
	add := func(types []string, c Class, list *[]string) error {
		for _, t := range types {
			if t == "" || len(t) > maxTypeLen {
				return fmt.Errorf("%w: job type %q must be 1 to %d bytes", ErrInvalidArgument, t, maxTypeLen)
			}
			switch p.class[t] {
			case c:
				continue // listed twice in one class: harmless
			case "":
				p.class[t] = c
				*list = append(*list, t)
			default:
				return fmt.Errorf("%w: job type %s is both safe and blocked", ErrInvalidArgument, t)
			}
		}
		return nil
	}
	for _, step := range []struct {
		types []string
		class Class
		list  *[]string
	}{
		{SafeTypes(), ClassSafe, &p.safe},
		{BlockedTypes(), ClassBlocked, &p.blocked},
		{extraSafe, ClassSafe, &p.safe},
		{extraBlocked, ClassBlocked, &p.blocked},
	} {
		if err := add(step.types, step.class, step.list); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Class returns the class of jobType: ClassUnknown for a type the policy
// does not list.
func (p *Policy) Class(jobType string) Class {
	if c, ok := p.class[jobType]; ok {
		return c
	}
	return ClassUnknown
}

// SafeTypes returns the safe types: the canonical ones, then the host's.
func (p *Policy) SafeTypes() []string { return slices.Clone(p.safe) }

// BlockedTypes returns the listed blocked types: the canonical ones, then
// the host's. Unknown types are blocked too, but not listed.
func (p *Policy) BlockedTypes() []string { return slices.Clone(p.blocked) }
