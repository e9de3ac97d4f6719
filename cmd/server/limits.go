package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi"
)

// The HTTP server's bounds, so that no client holds a connection, or the
// memory behind it, for long without being answered: a caller without a
// credential is answered 401 before its body is read (workerapi's
// pipeline), a slow one is cut off by the timeouts, and the connections
// served at once are capped, the others waiting in the kernel's accept
// queue, which costs the server nothing.
//
// Within the API, each caller gets a share (workerapi.Shares): a node's
// long-polls are capped (-max-long-polls-per-node), all long-polls
// together stay under -max-conns (-max-long-polls, three quarters of it
// by default), so that /healthz, /readyz and /metrics, and the requests
// that do not wait, always find a connection, and the body bytes read at
// once are capped (-body-budget).
const (
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds reading a whole request, body included.
	// net/http lifts the deadline once the body is read, so a long-poll
	// may outlast it.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a request's handling and answer, from the
	// end of its headers: above the longest long-poll (60 s) and the wait
	// for a completion's proofs.
	DefaultWriteTimeout = 90 * time.Second
	// DefaultIdleTimeout is how long a keep-alive connection may wait for
	// its next request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block (a worker's
	// three signature fields are at most 8 KiB each).
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxConns caps the connections served at once.
	DefaultMaxConns = 512
)

// httpLimits are the flags of the server's bounds.
type httpLimits struct {
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration
	maxHeaderBytes, maxConns                                  int
	maxLongPolls, maxLongPollsPerNode                         int
	bodyBudget                                                int64
}

func httpLimitFlags(fs *flag.FlagSet) *httpLimits {
	l := &httpLimits{}
	fs.DurationVar(&l.readHeaderTimeout, "read-header-timeout", DefaultReadHeaderTimeout, "time to read a request's headers (0: no limit)")
	fs.DurationVar(&l.readTimeout, "read-timeout", DefaultReadTimeout, "time to read a whole request, body included (0: no limit)")
	fs.DurationVar(&l.writeTimeout, "write-timeout", DefaultWriteTimeout, "time to handle and answer a request, above the longest long-poll (0: no limit)")
	fs.DurationVar(&l.idleTimeout, "idle-timeout", DefaultIdleTimeout, "time a keep-alive connection may wait for its next request (0: the read timeout)")
	fs.IntVar(&l.maxHeaderBytes, "max-header-bytes", DefaultMaxHeaderBytes, "the largest header block of a request, in bytes")
	fs.IntVar(&l.maxConns, "max-conns", DefaultMaxConns, "connections served at once; others wait to be accepted (0: no limit)")
	fs.IntVar(&l.maxLongPolls, "max-long-polls", 0, "long-polls open at once, of all nodes; one more is refused 503 server_busy (0: three quarters of -max-conns, no limit without it; must be under -max-conns, so that probes find a connection)")
	fs.IntVar(&l.maxLongPollsPerNode, "max-long-polls-per-node", workerapi.DefaultLongPollsPerNode, "long-polls one node may have open at once; one more is refused 429 too_many_long_polls")
	fs.Int64Var(&l.bodyBudget, "body-budget", workerapi.DefaultBodyBytes, "bytes of request bodies read into memory at once, by all requests; a request past it waits up to 1s, then is refused 503 server_busy before its body is read")
	return l
}

func (l *httpLimits) check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"read-header-timeout", l.readHeaderTimeout}, {"read-timeout", l.readTimeout},
		{"write-timeout", l.writeTimeout}, {"idle-timeout", l.idleTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("-%s must not be negative (%v)", d.name, d.v)
		}
	}
	switch {
	case l.maxHeaderBytes < 1:
		return fmt.Errorf("-max-header-bytes must be positive (%d)", l.maxHeaderBytes)
	case l.maxConns < 0:
		return fmt.Errorf("-max-conns must not be negative (%d)", l.maxConns)
	case l.maxLongPolls < 0:
		return fmt.Errorf("-max-long-polls must not be negative (%d)", l.maxLongPolls)
	case l.maxConns > 0 && l.maxLongPolls >= l.maxConns:
		return fmt.Errorf("-max-long-polls (%d) must be under -max-conns (%d), so that probes and requests that do not wait find a connection", l.maxLongPolls, l.maxConns)
	case l.maxLongPollsPerNode < 1:
		return fmt.Errorf("-max-long-polls-per-node must be positive (%d)", l.maxLongPollsPerNode)
	case l.bodyBudget < workerapi.DefaultBodyLimit:
		return fmt.Errorf("-body-budget must be at least the body limit, %d bytes (%d)", workerapi.DefaultBodyLimit, l.bodyBudget)
	}
	return nil
}

// shares are the API's shares of the flags (workerapi.Config.Shares).
func (l *httpLimits) shares() workerapi.Shares {
	polls := l.maxLongPolls
	switch {
	case polls > 0:
	case l.maxConns > 0:
		polls = max(l.maxConns*3/4, 1)
	default:
		polls = -1 // no limit
	}
	return workerapi.Shares{BodyBytes: l.bodyBudget, LongPollsPerNode: l.maxLongPollsPerNode, LongPolls: polls}
}

func (l *httpLimits) apply(srv *http.Server) {
	srv.ReadHeaderTimeout = l.readHeaderTimeout
	srv.ReadTimeout = l.readTimeout
	srv.WriteTimeout = l.writeTimeout
	srv.IdleTimeout = l.idleTimeout
	srv.MaxHeaderBytes = l.maxHeaderBytes
}

// limitListener returns ln accepting at most n connections at a time (no
// limit when n is 0): Accept waits until a connection it returned is
// closed. It is golang.org/x/net/netutil.LimitListener, which the module
// does not otherwise need.
func limitListener(ln net.Listener, n int) net.Listener {
	if n == 0 {
		return ln
	}
	return &limited{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limited struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limited) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limited) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
