// Package envelope is nodelane's safety envelope: which job
// types a worker may lease and accept, and the operator switch that lets
// the blocked ones run for a while.
//
// A [Policy] sorts job types into three classes. Safe types
// ([SafeTypes]: status_check, telemetry_sync, ...) always run. Blocked
// types ([BlockedTypes]: lora_train, raw_training, ...) and every type the
// policy does not know run only while an operator has activated the
// runtime, and, when the activation has a deadline, only before it. A
// host may add types to either class through [Config], and an operator
// may make types the policy does not list safe at run time with
// [Gate.SetSafeTypes] (never a blocked one: [NotSafeableError]).
//
// The runtime's state carries a policy version that starts at 1, with the
// runtime inactive, and grows by one with every change: an activation, a
// deactivation, the recorded end of a timed activation, or a change of
// the run-time safe types. Each change is
// appended to a history. Nodes, leases and receipts carry the version in
// force, so anyone can tell under which policy a job was granted.
//
// A [Gate] holds the logic over a [Store] (a [MemoryStore] here, bunstore
// for SQLite and PostgreSQL). A request reads the state once as a
// [Snapshot] and asks it about each job type; the answer is pure, so one
// request sees one policy throughout. A deadline takes effect on its own:
// a snapshot taken at or after it allows no blocked type, whether or not
// the end has been recorded yet. The maintainer records it with
// [Gate.ExpireActivation], which any number of replicas may call at once.
//
// Every change is written only if the version is still the one the Gate
// read (compare and swap); when another replica got there first the Gate
// reads again and retries, so concurrent changes each get a version of
// their own and none is lost. Stores pass the conformance suite in
// package envelopetest.
package envelope
