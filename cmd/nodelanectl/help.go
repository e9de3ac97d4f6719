package main

import (
	"fmt"
	"io"
)

// helpText is what GROUP VERB -h shows beside the flags: what the
// command does, and an example or two.
type helpText struct {
	desc    string
	example string
}

// helps are the help texts by "group verb"; TestEveryCommandHasHelp
// checks that each command has one.
var helps = map[string]helpText{
	"jobs submit": {
		"Queue a job (POST /operator/jobs). With -wait, follow it until it ends: the exit status is 0 when it\n" +
			"succeeded, 6 when it failed, 7 when it was canceled, and -o json or yaml print the job as it ended.",
		"nodelanectl jobs submit -type status_check -gpu-sku rtx-4090 -payload '{\"n\":1}'\n" +
			"  nodelanectl jobs submit -type embed -payload-file job.json -wait -timeout 30m\n" +
			"  id=$(nodelanectl jobs submit -q -type status_check)",
	},
	"jobs list": {
		"List jobs, newest first (-order asc: oldest first), a page at a time: 'more: -after ID' names the next.",
		"nodelanectl jobs list -state failed -limit 20\n  nodelanectl jobs list -type lora_train -o wide\n  nodelanectl jobs list -state queued -q | xargs -n1 nodelanectl jobs cancel",
	},
	"jobs show": {
		"Show a job: its state, requirements, result, cost, and its artifacts.",
		"nodelanectl jobs show job_…\n  nodelanectl jobs show -o yaml job_…",
	},
	"jobs cancel": {
		"Cancel a job: a queued job ends canceled at once; a running one is asked to stop.",
		"nodelanectl jobs cancel job_…",
	},
	"jobs retry": {
		"Queue a failed or canceled job again, with a fresh attempt budget (POST /operator/jobs/{id}/retry,\n" +
			"recorded in a job_retried receipt). Any other state is refused (409).",
		"nodelanectl jobs retry -reason 'driver fixed' job_…\n  nodelanectl jobs retry -wait job_…",
	},
	"jobs logs": {
		"Print a job's events, one a line (control characters escaped). -follow polls until the job ends, then\n" +
			"prints its final state to standard error; with -exit-status (which follows) the exit status is the job's\n" +
			"end: 0 succeeded, 6 failed, 7 canceled.",
		"nodelanectl jobs logs job_…\n  nodelanectl jobs logs -f -exit-status job_…\n  nodelanectl jobs logs -o json job_… | jq .message",
	},
	"artifacts list": {
		"List artifacts, newest first: stored (the control plane holds their bytes: artifacts download) or\nmetadata only.",
		"nodelanectl artifacts list -job job_…\n  nodelanectl artifacts list -type checkpoint -o wide",
	},
	"artifacts download": {
		"Download an artifact's stored bytes, verified against its sha256 before they replace FILE.",
		"nodelanectl artifacts download -o adapter.safetensors art_…",
	},
	"workers list": {
		"List workers, newest first, with their liveness, approval, ban and GPUs.",
		"nodelanectl workers list\n  nodelanectl workers list -o wide -no-headers",
	},
	"workers show": {
		"Show a worker and the leases it holds.",
		"nodelanectl workers show wrk_…",
	},
	"workers ban": {
		"Ban a worker and its node key: it is granted no job, its leases are revoked. Recorded in a receipt.",
		"nodelanectl workers ban -reason 'wrong results' wrk_…",
	},
	"workers unban": {
		"Lift a worker's ban. Recorded in a receipt.",
		"nodelanectl workers unban -reason 'reimaged' wrk_…",
	},
	"workers approve": {
		"Approve a pending worker, optionally pinning the job types it may be granted and the tags the\noperator vouches for. Recorded in a receipt.",
		"nodelanectl workers approve -job-type status_check -tag lab-a -reason vetted wrk_…",
	},
	"workers retire": {
		"Retire a worker for good: it is granted no job and cannot come back. Recorded in a receipt.",
		"nodelanectl workers retire -reason decommissioned wrk_…",
	},
	"workers drain": {
		"Ask a worker to drain: it finishes what it holds and is granted no new job until resumed.",
		"nodelanectl workers drain wrk_…",
	},
	"workers resume": {
		"Withdraw a drain request: the worker may be granted jobs again.",
		"nodelanectl workers resume wrk_…",
	},
	"envelope status": {
		"Show the envelope: whether the runtime is active, its policy version, the safe and blocked job types.",
		"nodelanectl envelope status -o yaml",
	},
	"envelope activate": {
		"Activate the runtime: blocked job types may run, until -until or for -for. Recorded in a receipt.",
		"nodelanectl envelope activate -reason 'training run 12' -for 8h",
	},
	"envelope deactivate": {
		"Deactivate the runtime: blocked job types stay queued. Recorded in a receipt.",
		"nodelanectl envelope deactivate -reason done",
	},
	"envelope safe-types": {
		"Change the envelope's safe job types (POST /operator/envelope/safe-types): a safe type runs without\n" +
			"the runtime active. A new policy version, recorded in a receipt. The canonical blocked types\n" +
			"(raw_training, model_file_write, ...) can never be made safe (400).",
		"nodelanectl envelope safe-types -add embed_batch -reason 'inference only'\n  nodelanectl envelope safe-types -remove embed_batch -reason 'retired'",
	},
	"envelope history": {
		"List the envelope's changes, newest first: the receipts of the envelope kinds (activations,\ndeactivations, safe-type changes), each with its policy version, actor and reason.",
		"nodelanectl envelope history -limit 10",
	},
	"credentials mint": {
		"Mint a credential; its token is written to -token-out (created 0600), never to the terminal.",
		"nodelanectl credentials mint -principal operator -scope operator:jobs -ttl 720h -token-out jobs.token",
	},
	"credentials list": {
		"List credentials (never their tokens), each page newest first: credential ids are random, so pages\nfollow the ids and each is sorted by creation here.",
		"nodelanectl credentials list -principal operator",
	},
	"credentials revoke": {
		"Revoke a credential: its token is refused from now on. Recorded in a receipt.",
		"nodelanectl credentials revoke -reason leaked cred_…",
	},
	"receipts list": {
		"List sequenced receipts, newest first (-order asc: from the first), with their log index, kind, time\nand subject; -kind for one kind. 'more: -after INDEX' names the next page.",
		"nodelanectl receipts list -kind job_charged -limit 20\n  nodelanectl receipts list -o wide",
	},
	"receipts show": {
		"Show a receipt's fields, and whether it is sequenced with an inclusion proof; -o json for the receipt,\nits proof and the checkpoint as the server sent them.",
		"nodelanectl receipts show rcp_…",
	},
	"receipts export": {
		"Export the receipt log (one JSON line a receipt, with proofs) and its signed checkpoint, for\nreceipts verify or cmd/verify-receipts.",
		"nodelanectl receipts export -out receipts.jsonl -checkpoint checkpoint.txt",
	},
	"receipts verify": {
		"Verify an export offline with the log's verifier key: every receipt's proof against the checkpoint.",
		"nodelanectl receipts verify -key \"$(cat receipt.pub)\" -checkpoint checkpoint.txt receipts.jsonl",
	},
	"cost report": {
		"Sum the job_charged costs of a window by sku, worker or job_type, with the unbilled GPU time, and\n" +
			"check the total against the receipts. -from and -to take RFC 3339, a date (2026-12-01, UTC), or an\n" +
			"age: 90m, 24h, 7d (that long before now).",
		"nodelanectl cost report -from 7d -by job_type\n  nodelanectl cost report -from 2026-11-01 -to 2026-12-01 -o yaml",
	},
}

// commandHelp writes the help of a command named "group verb": its
// description, flags and example. It is the -h of the command, and
// nodelanectl help GROUP VERB.
func (a *app) commandHelp(w io.Writer, name, args string, printFlags func()) {
	fmt.Fprintf(w, "usage: nodelanectl %s [flags] %s\n", name, args)
	if h, ok := helps[name]; ok {
		fmt.Fprintf(w, "\n%s\n\nFlags:\n", h.desc)
		printFlags()
		fmt.Fprintf(w, "\nExamples:\n  %s\n", h.example)
		return
	}
	printFlags()
}

// helpOf answers nodelanectl help [GROUP [VERB]].
func (a *app) helpOf(args []string) error {
	switch len(args) {
	case 0:
		a.usage(a.stdout)
		return nil
	case 1:
		verbs, ok := groups[args[0]]
		if !ok {
			return usagef("help: unknown command %q", args[0])
		}
		tw := newTable(a.stdout)
		for _, v := range sortedKeys(verbs) {
			tw.row("  "+args[0]+" "+v, verbs[v].summary)
		}
		tw.flush()
		return nil
	}
	verbs, ok := groups[args[0]]
	if !ok {
		return usagef("help: unknown command %q", args[0])
	}
	cmd, ok := verbs[args[1]]
	if !ok {
		return usagef("help: unknown verb %q of %s", args[1], args[0])
	}
	// The command's own -h, to standard output.
	a.stderr = a.stdout
	return cmd.run(a, []string{"-h"})
}
