// Command nodelanectl is an operator's command line for a nodelane control
// plane: it calls the operator routes (docs/PROTOCOL.md §13) with an
// operator token.
//
// Usage:
//
//	nodelanectl [-server URL] [-token-file FILE] [-config FILE] [-o table|json|yaml|wide] [-no-headers] [-q] GROUP VERB [flags] [args]
//
// The groups and verbs are jobs (submit, list, show, cancel, retry,
// logs), artifacts (list, download: the stored bytes, verified against
// the artifact's sha256 before they replace the file), workers (list,
// show, ban, unban, approve, retire, drain, resume), envelope (status,
// activate, deactivate, history), credentials (mint, list, revoke),
// receipts (list, show, export, verify) and cost (report); beside them
// version, completion bash|zsh and help [GROUP [VERB]]. `nodelanectl
// help` lists them; `nodelanectl GROUP VERB -h` describes one, with
// examples. The common flags may also follow the verb.
//
// The server URL is -server, else $NODELANE_SERVER, else the config
// file's server, else http://127.0.0.1:8080. The token is the content of
// -token-file, else $NODELANE_TOKEN, else the config file's token or
// token_file: never a flag's value, which every local user can read in
// the process list. The config file is -config, else $NODELANE_CONFIG,
// else $XDG_CONFIG_HOME/nodelane/nodelanectl.toml (~/.config/… when
// XDG_CONFIG_HOME is unset), TOML with the keys server, token, token_file,
// receipt_public_key, ca_file and insecure_http; a file that holds a
// token must be readable by its owner only.
//
// An https server's certificate is checked against the system's roots,
// or those of -ca-file (the config file's ca_file). A plain http:// server
// that is not this machine is refused, since the token would cross the
// network in clear, unless -insecure-http (insecure_http = true).
//
// Limits: a token file is at most 4 KiB and holds one token; a config
// file is at most 64 KiB; jobs logs -follow and -wait poll every
// -interval, 100 ms to 1 minute (1 s by default), for -timeout at most
// (none by default; exit status 8 when it runs out); every request times
// out after 60 s; envelope history reads at most 100 pages of each
// envelope receipt kind (the last 1,000,000 receipts of the log).
//
// Lists are newest first (-order asc: oldest first), a page at a time.
// Output is aligned tables (-o wide: with more columns; -no-headers:
// without the header row; -q: only ids, one a line), or with -o json the
// API's JSON answer as it came, with -o yaml the same as YAML (jobs logs
// writes one JSON event a line, or a YAML sequence item an event). In
// every format a character a terminal could act on is escaped. After
// artifacts download, -o names the file to write the artifact's bytes to
// (- for standard output); its report goes to standard error.
//
// The exit status is 0 on success; 1 when the server refuses the request
// (400, 409, ...), an export or a download does not verify or a cost
// check fails; 2 for a usage error; 3 without a token or when the server
// refuses it (401, 403); 4 for a 404; 5 when the server cannot be reached
// or answers 5xx or 429; 6 and 7 when the job of jobs submit -wait, jobs
// retry -wait or jobs logs -exit-status ended failed or canceled; 8 when
// -wait ran out of -timeout; and 130 when interrupted.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// usageError is a command line that cannot be run: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// common are the flags every command takes, before the group or after
// the verb.
type common struct {
	server       string
	tokenFile    string
	config       string
	output       string
	caFile       string
	insecureHTTP bool
	noHeaders    bool
	quiet        bool
}

// app is one run of the command.
type app struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	common common
	// now is the clock; tests of the package may set it.
	now func() time.Time
	// stallTimeout is how long a download waits for its next byte;
	// 0 means stallTimeout. Tests of the package may set it.
	stallTimeout time.Duration
	// settings once resolved.
	cfg *settings
	// api is the operator client once made.
	api *operator.Client
	// args are the command's arguments, after parse.
	args []string
	// lastFlags is the FlagSet the command made last: completion reads
	// each command's flags from it.
	lastFlags *flag.FlagSet
}

// command is a verb of a group.
type command struct {
	summary string
	run     func(a *app, args []string) error
}

// groups are the commands by group and verb.
var groups = map[string]map[string]command{
	"jobs": {
		"submit": {"queue a job", jobsSubmit},
		"list":   {"list jobs", jobsList},
		"show":   {"show a job, its result, events and artifacts", jobsShow},
		"cancel": {"cancel a job", jobsCancel},
		"retry":  {"queue a failed or canceled job again; -wait to follow it", jobsRetry},
		"logs":   {"print a job's events; -follow until it ends", jobsLogs},
	},
	"artifacts": {
		"list":     {"list artifacts, stored (bytes downloadable) or metadata only; -job for one job's", artifactsList},
		"download": {"download an artifact's stored bytes to -o FILE, verified against its sha256", artifactsDownload},
	},
	"workers": {
		"list":    {"list workers", workersList},
		"show":    {"show a worker and its leases", workersShow},
		"ban":     {"ban a worker (and its node key)", workerAction("ban", (*operator.Client).BanWorker)},
		"unban":   {"lift a worker's ban", workerAction("unban", (*operator.Client).UnbanWorker)},
		"approve": {"approve a pending worker, optionally pinning job types and tags", workersApprove},
		"retire":  {"retire a worker for good", workerAction("retire", (*operator.Client).RetireWorker)},
		"drain":   {"ask a worker to drain: it is granted no job until resumed", workerDrain("drain", (*operator.Client).DrainWorker)},
		"resume":  {"withdraw a drain request", workerDrain("resume", (*operator.Client).ResumeWorker)},
	},
	"envelope": {
		"status":     {"show the envelope", envelopeStatus},
		"activate":   {"activate the runtime: blocked job types may run", envelopeActivate},
		"deactivate": {"deactivate the runtime", envelopeDeactivate},
		"history":    {"list the envelope's changes, newest first", envelopeHistory},
		"safe-types": {"make job types safe (they run without the runtime active), or no longer", envelopeSafeTypes},
	},
	"credentials": {
		"mint":   {"mint a credential; its token goes to -token-out", credentialsMint},
		"list":   {"list credentials (never their tokens)", credentialsList},
		"revoke": {"revoke a credential", credentialsRevoke},
	},
	"receipts": {
		"export": {"export the receipt log and its signed checkpoint", receiptsExport},
		"verify": {"verify an export offline with the verifier key", receiptsVerify},
		"list":   {"list sequenced receipts, newest first; -kind for one kind", receiptsList},
		"show":   {"show a receipt and whether it has an inclusion proof", receiptsShow},
	},
	"cost": {
		"report": {"sum job_charged costs by sku, worker or job_type; checked against the receipts", costReport},
	},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return newApp(ctx, stdout, stderr, getenv).run(args)
}

func newApp(ctx context.Context, stdout, stderr io.Writer, getenv func(string) string) *app {
	return &app{ctx: ctx, stdout: stdout, stderr: stderr, getenv: getenv, now: time.Now, common: common{output: "table"}}
}

// run runs the command line args and returns the exit status.
func (a *app) run(args []string) int {
	ctx, stderr := a.ctx, a.stderr
	err := a.dispatch(args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	code := exitCode(ctx, err)
	var ue *usageError
	var we *wire.Error
	switch {
	case err == nil:
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "nodelanectl:", err)
		fmt.Fprintln(stderr, "run 'nodelanectl help' for usage")
	case code == exitInterrupted:
		fmt.Fprintln(stderr, "nodelanectl: interrupted")
	case errors.As(err, &we):
		fmt.Fprintf(stderr, "nodelanectl: the server answered %d %s: %s\n  (%s)\n", we.Status, escapeText(we.Code, false), escapeText(we.Message, false), escapeText(we.Route, false))
	default:
		fmt.Fprintln(stderr, "nodelanectl:", escapeText(err.Error(), false))
	}
	return code
}

func (a *app) dispatch(args []string) error {
	fs := flag.NewFlagSet("nodelanectl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.bindCommon(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			a.usage(a.stdout)
			return err
		}
		return usagef("%v", err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usagef("no command")
	}
	switch rest[0] {
	case "help":
		return a.helpOf(rest[1:])
	case "version":
		return a.version(rest[1:])
	case "completion":
		return a.completion(rest[1:])
	}
	verbs, ok := groups[rest[0]]
	if !ok {
		return usagef("unknown command %q", rest[0])
	}
	if len(rest) < 2 {
		return usagef("%s needs a verb: %s", rest[0], strings.Join(sortedKeys(verbs), ", "))
	}
	cmd, ok := verbs[rest[1]]
	if !ok {
		return usagef("unknown verb %q of %s: %s", rest[1], rest[0], strings.Join(sortedKeys(verbs), ", "))
	}
	return cmd.run(a, rest[2:])
}

// usage writes the list of commands.
func (a *app) usage(w io.Writer) {
	fmt.Fprint(w, `usage: nodelanectl [-server URL] [-token-file FILE] [-config FILE] [-ca-file FILE] [-insecure-http]
                   [-o table|json|yaml|wide] [-no-headers] [-q] GROUP VERB [flags] [args]

The server is -server, $NODELANE_SERVER, the config file's server, or http://127.0.0.1:8080.
The token is read from -token-file, $NODELANE_TOKEN, or the config file's token or token_file.
The config file is -config, $NODELANE_CONFIG, or $XDG_CONFIG_HOME/nodelane/nodelanectl.toml.
Lists are newest first (-order asc: oldest first). -o wide adds columns to tables, -no-headers drops
their header, -q prints only ids (lists, jobs submit, retry and cancel); -o json prints the API's
answers as they came, -o yaml the same as YAML; control characters are escaped in every format.
'nodelanectl help GROUP VERB' or 'nodelanectl GROUP VERB -h' describes a command, with examples.

Commands:
`)
	tw := newTable(w)
	for _, g := range sortedKeys(groups) {
		for _, v := range sortedKeys(groups[g]) {
			tw.row("  "+g+" "+v, groups[g][v].summary)
		}
	}
	tw.row("  version", "print nodelanectl's version and build")
	tw.row("  completion bash|zsh", "print a shell completion script (source <(nodelanectl completion bash))")
	tw.row("  help [GROUP [VERB]]", "this help, a group's commands, or a command's")
	tw.flush()
	fmt.Fprint(w, "\n"+exitHelp)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// bindCommon defines the common flags on fs, over what earlier flags set,
// but those named in but.
func (a *app) bindCommon(fs *flag.FlagSet, but ...string) {
	fs.StringVar(&a.common.server, "server", a.common.server, "the control plane's base `URL`")
	fs.StringVar(&a.common.tokenFile, "token-file", a.common.tokenFile, "the `file` holding the operator token")
	fs.StringVar(&a.common.config, "config", a.common.config, "the config `file`")
	if !slices.Contains(but, "o") {
		fs.StringVar(&a.common.output, "o", a.common.output, "output: table, json, yaml or wide")
	}
	fs.BoolVar(&a.common.noHeaders, "no-headers", a.common.noHeaders, "print tables without their header row")
	fs.BoolVar(&a.common.quiet, "q", a.common.quiet, "print only ids, one a line (lists, jobs submit, retry, cancel)")
	fs.StringVar(&a.common.caFile, "ca-file", a.common.caFile, "PEM `file` of the certificate authorities to trust for an https server, instead of the system's")
	fs.BoolVar(&a.common.insecureHTTP, "insecure-http", a.common.insecureHTTP, "allow an http:// server that is not this machine (the token crosses the network in clear)")
}

// flags returns the FlagSet of a command, with the common flags.
func (a *app) flags(name, args string) *flag.FlagSet { return a.flagsBut(name, args) }

// flagsBut returns the FlagSet of a command, with the common flags but
// those named in but, which the command defines its own way.
func (a *app) flagsBut(name, args string, but ...string) *flag.FlagSet {
	fs := flag.NewFlagSet("nodelanectl "+name, flag.ContinueOnError)
	a.lastFlags = fs
	fs.SetOutput(a.stderr)
	fs.Usage = func() { a.commandHelp(fs.Output(), name, args, fs.PrintDefaults) }
	a.bindCommon(fs, but...)
	return fs
}

// parse parses a command's flags, which may come before, between and
// after its arguments (all after "--" are arguments), and checks the
// number of arguments; a.arg reads them.
func (a *app) parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) error {
	a.args = nil
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usagef("%s: %v", fs.Name(), err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			a.args = append(a.args, rest...)
			break
		}
		a.args = append(a.args, rest[0])
		args = rest[1:]
	}
	if n := len(a.args); n < minArgs || n > maxArgs {
		fs.Usage()
		if minArgs == maxArgs {
			return usagef("%s takes %d argument(s), got %d", fs.Name(), minArgs, n)
		}
		return usagef("%s takes %d to %d arguments, got %d", fs.Name(), minArgs, maxArgs, n)
	}
	if !slices.Contains(outputFormats, a.common.output) {
		return usagef("-o %q: want one of %s", a.common.output, strings.Join(outputFormats, ", "))
	}
	return nil
}

// arg is the command's i-th argument, after parse.
func (a *app) arg(i int) string { return a.args[i] }

// client resolves the settings and returns the operator client, made
// once.
func (a *app) client() (*operator.Client, error) {
	if a.api != nil {
		return a.api, nil
	}
	s, err := a.settings()
	if err != nil {
		return nil, err
	}
	if s.token == "" {
		return nil, fmt.Errorf("%w: give -token-file, set %s, or set token or token_file in the config file (%s)", errNoToken, envToken, s.configPath)
	}
	hc, err := httpClient(s)
	if err != nil {
		return nil, err
	}
	api, err := operator.New(s.server, s.token, &operator.Config{HTTPClient: hc, AllowInsecureHTTP: s.insecureHTTP})
	if err != nil {
		return nil, err
	}
	a.api = api
	return api, nil
}

// answerKey is the context key under which a request asks the client's
// transport (answerTap) to keep its answer's body.
type answerKey struct{}

// keepAnswer returns a context under which the answer to the client's
// call is also kept, as it came, in the buffer: what -o json prints,
// while a table reads the typed answer.
func (a *app) keepAnswer() (context.Context, *bytes.Buffer) {
	b := new(bytes.Buffer)
	return context.WithValue(a.ctx, answerKey{}, b), b
}

// answerTap is the transport of the operator client: it copies the body
// of each answer to a request made under keepAnswer's context into its
// buffer as the client reads it (the client reads every answer whole).
type answerTap struct{ next http.RoundTripper }

func (t answerTap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if b, ok := req.Context().Value(answerKey{}).(*bytes.Buffer); ok && err == nil {
		b.Reset()
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(resp.Body, b), resp.Body}
	}
	return resp, err
}

// ask makes one call of the operator client with its answer kept: with
// -o json or yaml (and no -q) it prints the answer (printRaw) and returns
// nil and nil; else it returns the typed answer, for the caller's table
// or ids.
func ask[T any](a *app, call func(ctx context.Context, api *operator.Client) (*T, error)) (*T, error) {
	api, err := a.client()
	if err != nil {
		return nil, err
	}
	ctx, raw := a.keepAnswer()
	out, err := call(ctx, api)
	if err != nil {
		return nil, err
	}
	if a.raw() && !a.common.quiet {
		return nil, a.printRaw(raw.Bytes())
	}
	return out, nil
}

// printJSON writes a JSON text, with a final newline.
func (a *app) printJSON(b []byte) error {
	if _, err := a.stdout.Write(b); err != nil {
		return err
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		_, err := io.WriteString(a.stdout, "\n")
		return err
	}
	return nil
}
