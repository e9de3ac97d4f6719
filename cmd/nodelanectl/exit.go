package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// Exit statuses; exitHelp lists them for nodelanectl help.
const (
	exitOK = 0
	// exitFail is any other failure: the server refused the request
	// (400, 409, ...), an export or a download does not verify, a cost
	// check fails.
	exitFail  = 1
	exitUsage = 2
	// exitAuth is a request without a token, or one the server refused:
	// 401 (no valid token) or 403 (a scope it lacks).
	exitAuth = 3
	// exitNotFound is a 404: no such job, worker, artifact, ....
	exitNotFound = 4
	// exitUnavailable is a server that cannot be reached (connection
	// refused, DNS, a network timeout) or that answers 5xx or 429: try
	// again later.
	exitUnavailable = 5
	// exitJobFailed and exitJobCanceled are a job that ended failed or
	// canceled, with jobs submit -wait or -exit-status, jobs logs
	// -exit-status.
	exitJobFailed   = 6
	exitJobCanceled = 7
	// exitWaitTimeout is a -wait that ran out of -timeout before the job
	// ended; the job goes on.
	exitWaitTimeout = 8
	exitInterrupted = 130
)

// exitHelp documents the exit statuses, for nodelanectl help.
const exitHelp = `Exit status:
  0    success (with -wait or -exit-status: the job succeeded)
  1    the server refused the request (400, 409, ...), or a check failed (receipts verify, cost report, a download)
  2    usage: a bad command line or flag value
  3    auth: no operator token, or the server refused it (401) or its scopes (403)
  4    not found (404)
  5    unavailable: the server could not be reached (connection refused, DNS, timeout) or answered 5xx or 429
  6    the job ended failed (jobs submit -wait, -exit-status; jobs logs -exit-status)
  7    the job ended canceled (idem)
  8    -wait ran out of -timeout before the job ended (the job goes on)
  130  interrupted (SIGINT or SIGTERM)
`

// errNoToken is a command that needs the server run without a token.
var errNoToken = errors.New("no operator token")

// jobEndError is a job that ended other than succeeded, for a command
// whose exit status reflects it.
type jobEndError struct {
	ID, State string
	// LastError is the job's last error, nil when it has none.
	LastError *wire.JobError
}

func (e *jobEndError) Error() string {
	msg := fmt.Sprintf("job %s ended %s", e.ID, e.State)
	if e.LastError != nil {
		msg += ": " + e.LastError.Code + ": " + e.LastError.Message
	}
	return msg
}

// errWaitTimeout is a wait for a job that ran out of time.
var errWaitTimeout = errors.New("the job did not end in time")

// exitCode is the exit status of a command that returned err; ctx is
// the command's, whose cancellation is an interruption.
func exitCode(ctx context.Context, err error) int {
	var (
		ue  *usageError
		we  *wire.Error
		je  *jobEndError
		ne  net.Error
		oe  *net.OpError
		dne *net.DNSError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.As(err, &je):
		if je.State == "canceled" {
			return exitJobCanceled
		}
		return exitJobFailed
	case errors.Is(err, errWaitTimeout):
		return exitWaitTimeout
	case errors.Is(err, errNoToken):
		return exitAuth
	case errors.As(err, &we):
		switch {
		case we.Status == http.StatusUnauthorized || we.Status == http.StatusForbidden:
			return exitAuth
		case we.Status == http.StatusNotFound:
			return exitNotFound
		case we.Status >= 500 || we.Status == http.StatusTooManyRequests:
			return exitUnavailable
		}
		return exitFail
	case errors.As(err, &oe) && (oe.Op == "dial" || oe.Op == "read" || oe.Op == "write"), errors.As(err, &dne),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return exitUnavailable
	}
	return exitFail
}
