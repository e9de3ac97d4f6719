package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// workerView is an operator worker view; Status may be "retired" with
// the API's later versions.
type workerView = wire.WorkerView

func workersList(a *app, args []string) error {
	fs := a.flags("workers list", "")
	after := fs.String("after", "", "list workers after this id (the answer's next)")
	limit := fs.Int("limit", 1000, "workers a page, 1 to 1000")
	order := orderFlag(fs)
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("workers list", *limit); err != nil {
		return err
	}
	if err := checkOrder("workers list", *order); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.WorkerListResponse, error) {
		return api.ListWorkers(ctx, operator.WorkerQuery{After: *after, Limit: *limit, Order: *order})
	})
	if out == nil || err != nil {
		return err
	}
	printList(a, workerCols, out.Workers, func(w workerView) string { return w.WorkerID }, derefStr(out.Next))
	return nil
}

// workerCols are the columns of workers list.
var workerCols = []col[workerView]{
	{name: "ID", cell: func(w workerView) string { return w.WorkerID }},
	{name: "NODE", cell: func(w workerView) string { return w.NodeID }},
	{name: "STATUS", cell: func(w workerView) string { return w.Status }},
	{name: "LIVENESS", cell: func(w workerView) string { return w.Liveness }},
	{name: "APPROVAL", cell: func(w workerView) string { return w.Approval }},
	{name: "BANNED", cell: func(w workerView) string { return strconv.FormatBool(w.Banned) }},
	{name: "GPUS", cell: gpus},
	{name: "TAGS", cell: func(w workerView) string { return orDash(strings.Join(w.Tags, ",")) }},
	{name: "LAST_SEEN", cell: func(w workerView) string { return tstr(w.LastSeenAt) }},
	{name: "NAME", wide: true, cell: func(w workerView) string { return orDash(w.Name) }},
	{name: "HOSTNAME", wide: true, cell: func(w workerView) string { return orDash(w.Hostname) }},
	{name: "DRAIN", wide: true, cell: func(w workerView) string { return strconv.FormatBool(w.Drain) }},
	{name: "MAX_LEASES", wide: true, cell: func(w workerView) string { return strconv.Itoa(w.MaxLeases) }},
	{name: "REGISTERED", wide: true, cell: func(w workerView) string { return tstr(w.RegisteredAt) }},
}

// gpus summarises a worker's GPUs as "2×rtx-4090".
func gpus(w workerView) string {
	n := map[string]int{}
	var order []string
	for _, g := range w.Capabilities.GPUs {
		if n[g.SKU] == 0 {
			order = append(order, g.SKU)
		}
		n[g.SKU]++
	}
	var parts []string
	for _, s := range order {
		parts = append(parts, fmt.Sprintf("%d×%s", n[s], s))
	}
	return orDash(strings.Join(parts, ","))
}

func workersShow(a *app, args []string) error {
	fs := a.flags("workers show", "WORKER_ID")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.WorkerDetailResponse, error) {
		return api.Worker(ctx, a.arg(0))
	})
	if out == nil || err != nil {
		return err
	}
	printWorker(a, out.Worker)
	if len(out.Leases) > 0 {
		fmt.Fprintln(a.stdout)
		t := newTable(a.stdout)
		t.row("JOB", "TYPE", "STATE", "LEASE", "EPOCH", "EXPIRES")
		for _, l := range out.Leases {
			t.row(l.JobID, l.JobType, l.State, l.LeaseID, strconv.FormatInt(l.LeaseEpoch, 10), tstr(l.ExpiresAt))
		}
		t.flush()
	}
	return nil
}

func printWorker(a *app, w workerView) {
	t := newTable(a.stdout)
	t.row("id", w.WorkerID)
	t.row("node", w.NodeID)
	t.row("name", w.Name)
	t.row("hostname", w.Hostname)
	t.row("status", w.Status)
	t.row("liveness", w.Liveness)
	t.row("approval", w.Approval)
	if len(w.ApprovedJobTypes) > 0 || len(w.ApprovedTags) > 0 {
		t.row("approved_pins", "job_types="+orDash(strings.Join(w.ApprovedJobTypes, ","))+" tags="+orDash(strings.Join(w.ApprovedTags, ",")))
	}
	t.row("banned", strconv.FormatBool(w.Banned)+" "+strp(w.BanReason))
	drain := strconv.FormatBool(w.Drain)
	if w.DrainRequestedAt != nil {
		drain += " (by " + strp(w.DrainRequestedBy) + " at " + tstr(*w.DrainRequestedAt) + ")"
	}
	t.row("drain", drain)
	t.row("gpus", gpus(w))
	t.row("tags", orDash(strings.Join(w.Tags, ",")))
	t.row("max_leases", strconv.Itoa(w.MaxLeases))
	t.row("registered", tstr(w.RegisteredAt))
	t.row("last_seen", tstr(w.LastSeenAt))
	t.flush()
}

// workerAction is ban, unban or retire (call: the client's BanWorker,
// UnbanWorker or RetireWorker), with a reason.
func workerAction(verb string, call func(api *operator.Client, ctx context.Context, id, reason string) (*wire.WorkerResponse, error)) func(a *app, args []string) error {
	return func(a *app, args []string) error {
		fs := a.flags("workers "+verb, "WORKER_ID")
		reason := fs.String("reason", "", "the reason, recorded in the receipt")
		if err := a.parse(fs, args, 1, 1); err != nil {
			return err
		}
		out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.WorkerResponse, error) {
			return call(api, ctx, a.arg(0), *reason)
		})
		if out == nil || err != nil {
			return err
		}
		return a.printWorkerResponse(out)
	}
}

// workerDrain is drain or resume (call: the client's DrainWorker or
// ResumeWorker). A drained worker is granted no job until it is resumed.
func workerDrain(verb string, call func(api *operator.Client, ctx context.Context, id string) (*wire.WorkerResponse, error)) func(a *app, args []string) error {
	return func(a *app, args []string) error {
		fs := a.flags("workers "+verb, "WORKER_ID")
		if err := a.parse(fs, args, 1, 1); err != nil {
			return err
		}
		out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.WorkerResponse, error) {
			return call(api, ctx, a.arg(0))
		})
		if out == nil || err != nil {
			return err
		}
		return a.printWorkerResponse(out)
	}
}

// printWorkerResponse prints a worker action's answer as a table.
func (a *app) printWorkerResponse(out *wire.WorkerResponse) error {
	t := newTable(a.stdout)
	t.row("ID", "NODE", "STATUS", "APPROVAL", "BANNED", "DRAIN", "RECEIPT")
	t.row(out.Worker.WorkerID, out.Worker.NodeID, out.Worker.Status, out.Worker.Approval, strconv.FormatBool(out.Worker.Banned),
		strconv.FormatBool(out.Worker.Drain), strp(out.ReceiptID))
	t.flush()
	return nil
}

func workersApprove(a *app, args []string) error {
	fs := a.flags("workers approve", "WORKER_ID")
	var jobTypes, tags stringList
	fs.Var(&jobTypes, "job-type", "pin a job type the worker may be granted (repeatable)")
	fs.Var(&tags, "tag", "pin a tag the operator vouches for (repeatable)")
	reason := fs.String("reason", "", "the reason, recorded in the receipt")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	req := wire.ApproveRequest{Reason: *reason}
	if len(jobTypes) > 0 {
		req.JobTypes = (*[]string)(&jobTypes)
	}
	if len(tags) > 0 {
		req.Tags = (*[]string)(&tags)
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.WorkerResponse, error) {
		return api.ApproveWorker(ctx, a.arg(0), req)
	})
	if out == nil || err != nil {
		return err
	}
	return a.printWorkerResponse(out)
}

// envelopeCall makes one call of the client on the envelope and prints
// its answer: as it came with -o json, else as a table.
func (a *app) envelopeCall(call func(api *operator.Client, ctx context.Context) (*wire.EnvelopeResponse, error)) error {
	e, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.EnvelopeResponse, error) { return call(api, ctx) })
	if e == nil || err != nil {
		return err
	}
	a.printEnvelope(e)
	return nil
}

// printEnvelope prints the envelope as a table.
func (a *app) printEnvelope(e *wire.EnvelopeResponse) {
	t := newTable(a.stdout)
	t.row("active", strconv.FormatBool(e.Active))
	t.row("policy_version", strconv.FormatInt(e.PolicyVersion, 10))
	t.row("by", orDash(e.By))
	t.row("reason", orDash(e.Reason))
	t.row("until", timep(e.Until))
	t.row("changed_at", timep(e.ChangedAt))
	t.row("safe_types", orDash(strings.Join(e.SafeTypes, ",")))
	t.row("runtime_safe_types", orDash(strings.Join(e.RuntimeSafeTypes, ",")))
	t.row("blocked_types", orDash(strings.Join(e.BlockedTypes, ",")))
	if e.ReceiptID != "" {
		t.row("receipt", e.ReceiptID)
	}
	t.flush()
}

func envelopeSafeTypes(a *app, args []string) error {
	fs := a.flags("envelope safe-types", "")
	var add, remove stringList
	fs.Var(&add, "add", "make this job type safe: it runs without the runtime active (repeatable, or comma-separated)")
	fs.Var(&remove, "remove", "make this job type no longer safe (repeatable, or comma-separated)")
	reason := fs.String("reason", "", "why (required), recorded in the receipt")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	switch {
	case len(add) == 0 && len(remove) == 0:
		return usagef("envelope safe-types: give -add or -remove")
	case *reason == "":
		return usagef("envelope safe-types: -reason is required")
	case len(*reason) > wire.MaxReasonBytes:
		return usagef("envelope safe-types: -reason is %d bytes, over %d", len(*reason), wire.MaxReasonBytes)
	}
	req := wire.SafeTypesRequest{Add: orEmpty(add), Remove: orEmpty(remove), Reason: *reason}
	return a.envelopeCall(func(api *operator.Client, ctx context.Context) (*wire.EnvelopeResponse, error) {
		return api.SetSafeTypes(ctx, req)
	})
}

// orEmpty is l, or an empty list for none (JSON [] rather than null).
func orEmpty(l stringList) []string {
	if l == nil {
		return []string{}
	}
	return l
}

func envelopeStatus(a *app, args []string) error {
	fs := a.flags("envelope status", "")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	return a.envelopeCall((*operator.Client).Envelope)
}

func envelopeActivate(a *app, args []string) error {
	fs := a.flags("envelope activate", "")
	reason := fs.String("reason", "", "why (required)")
	until := fs.String("until", "", "end the activation at this RFC 3339 `time`")
	dur := fs.Duration("for", 0, "end the activation after this `duration`")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("envelope activate: -reason is required")
	}
	req := wire.ActivateRequest{Reason: *reason}
	switch {
	case *until != "" && *dur != 0:
		return usagef("envelope activate: give -until or -for, not both")
	case *until != "":
		u, err := time.Parse(time.RFC3339, *until)
		if err != nil {
			return usagef("envelope activate: -until: %v", err)
		}
		req.Until = &u
	case *dur < 0:
		return usagef("envelope activate: -for %v is negative", *dur)
	case *dur > 0:
		u := a.now().Add(*dur).UTC()
		req.Until = &u
	}
	return a.envelopeCall(func(api *operator.Client, ctx context.Context) (*wire.EnvelopeResponse, error) {
		return api.ActivateEnvelope(ctx, req)
	})
}

func envelopeDeactivate(a *app, args []string) error {
	fs := a.flags("envelope deactivate", "")
	reason := fs.String("reason", "", "why (required)")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("envelope deactivate: -reason is required")
	}
	return a.envelopeCall(func(api *operator.Client, ctx context.Context) (*wire.EnvelopeResponse, error) {
		return api.DeactivateEnvelope(ctx, *reason)
	})
}

func credentialsMint(a *app, args []string) error {
	fs := a.flags("credentials mint", "")
	principal := fs.String("principal", "", "the principal's id (required)")
	var scopes stringList
	fs.Var(&scopes, "scope", "a scope (repeatable, or comma-separated; required)")
	ttl := fs.Duration("ttl", 0, "the credential's lifetime (0: 30 days)")
	maxReg := fs.Int64("max-registrations", 0, "with node:register, how many registrations it may authorise (0: no limit)")
	tokenOut := fs.String("token-out", "", "write the new token to this `file` (created 0600; must not exist; required)")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	switch {
	case *principal == "":
		return usagef("credentials mint: -principal is required")
	case len(scopes) == 0:
		return usagef("credentials mint: -scope is required")
	case *tokenOut == "":
		return usagef("credentials mint: -token-out is required: the token is shown once, and never on the terminal")
	case *ttl < 0 || *ttl%time.Second != 0:
		return usagef("credentials mint: -ttl %v is not a whole number of seconds", *ttl)
	case *maxReg < 0:
		return usagef("credentials mint: -max-registrations %d is negative", *maxReg)
	}
	// Create the file first, so that a token is never minted with
	// nowhere to go.
	f, err := os.OpenFile(*tokenOut, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("-token-out: %w", err)
	}
	minted := false
	defer func() {
		if !minted {
			f.Close()
			os.Remove(*tokenOut)
		}
	}()
	req := wire.MintCredentialRequest{Principal: *principal, Scopes: scopes, TTLSeconds: int64(*ttl / time.Second)}
	if *maxReg > 0 {
		req.MaxRegistrations = maxReg
	}
	api, err := a.client()
	if err != nil {
		return err
	}
	ctx, raw := a.keepAnswer()
	out, err := api.MintCredential(ctx, req)
	if errors.Is(err, operator.ErrMalformedAnswer) || (err == nil && out.Token == "") {
		return errors.New("undecodable answer: the credential may be minted; list and revoke it")
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(out.Token + "\n"); err != nil {
		return fmt.Errorf("-token-out: %w (credential %s is minted: revoke it)", err, out.CredentialID)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("-token-out: %w (credential %s is minted: revoke it)", err, out.CredentialID)
	}
	minted = true
	if a.raw() {
		// The API's answer, but the token is in the file.
		var m map[string]any
		if err := json.Unmarshal(raw.Bytes(), &m); err != nil {
			return err
		}
		delete(m, "token")
		m["token_file"] = *tokenOut
		j, err := json.Marshal(m)
		if err != nil {
			return err
		}
		return a.printRaw(j)
	}
	t := newTable(a.stdout)
	t.row("ID", "PRINCIPAL", "SCOPES", "EXPIRES", "RECEIPT", "TOKEN_FILE")
	t.row(out.CredentialID, out.Principal, strings.Join(out.Scopes, ","), tstr(out.ExpiresAt), out.ReceiptID, *tokenOut)
	t.flush()
	return nil
}

func credentialsList(a *app, args []string) error {
	fs := a.flags("credentials list", "")
	principal := fs.String("principal", "", "only this principal's credentials")
	after := fs.String("after", "", "list credentials after this id (the answer's next)")
	limit := fs.Int("limit", 100, "credentials a page, 1 to 1000")
	order := fs.String("order", orderDesc, "desc: each page newest first; asc: oldest first (credential ids are random: pages follow them, not time)")
	if err := a.parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := checkLimit("credentials list", *limit); err != nil {
		return err
	}
	if err := checkOrder("credentials list", *order); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.CredentialListResponse, error) {
		return api.ListCredentials(ctx, operator.CredentialQuery{Principal: *principal, After: *after, Limit: *limit})
	})
	if out == nil || err != nil {
		return err
	}
	// Credential ids are random, so no order of the API is newest first:
	// the page is sorted here, by creation.
	slices.SortStableFunc(out.Credentials, func(x, y wire.CredentialView) int {
		if *order == orderAsc {
			return x.CreatedAt.Compare(y.CreatedAt)
		}
		return y.CreatedAt.Compare(x.CreatedAt)
	})
	printList(a, credentialCols, out.Credentials, func(c wire.CredentialView) string { return c.CredentialID }, derefStr(out.Next))
	return nil
}

// credentialCols are the columns of credentials list.
var credentialCols = []col[wire.CredentialView]{
	{name: "ID", cell: func(c wire.CredentialView) string { return c.CredentialID }},
	{name: "PRINCIPAL", cell: func(c wire.CredentialView) string { return c.Principal }},
	{name: "SCOPES", cell: func(c wire.CredentialView) string { return strings.Join(c.Scopes, ",") }},
	{name: "CREATED", cell: func(c wire.CredentialView) string { return tstr(c.CreatedAt) }},
	{name: "EXPIRES", cell: func(c wire.CredentialView) string { return tstr(c.ExpiresAt) }},
	{name: "REVOKED", cell: func(c wire.CredentialView) string { return timep(c.RevokedAt) }},
	{name: "REGISTRATIONS", wide: true, cell: func(c wire.CredentialView) string {
		s := strconv.FormatInt(c.Registrations, 10)
		if c.MaxRegistrations != nil {
			s += "/" + strconv.FormatInt(*c.MaxRegistrations, 10)
		}
		return s
	}},
}

func credentialsRevoke(a *app, args []string) error {
	fs := a.flags("credentials revoke", "CREDENTIAL_ID")
	reason := fs.String("reason", "", "the reason, recorded in the receipt")
	if err := a.parse(fs, args, 1, 1); err != nil {
		return err
	}
	out, err := ask(a, func(ctx context.Context, api *operator.Client) (*wire.RevokeCredentialResponse, error) {
		return api.RevokeCredential(ctx, a.arg(0), *reason)
	})
	if out == nil || err != nil {
		return err
	}
	t := newTable(a.stdout)
	t.row("ID", "PRINCIPAL", "REVOKED", "RECEIPT")
	t.row(out.CredentialID, out.Principal, tstr(out.RevokedAt), strp(out.ReceiptID))
	t.flush()
	return nil
}
