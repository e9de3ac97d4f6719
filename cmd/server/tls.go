package main

import (
	"context"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nodelane/nodelane/cmd/internal/tlsserve"
)

// tlsServer is the server's TLS side (cmd/internal/tlsserve).
type tlsServer struct{ *tlsserve.Server }

// startTLS prepares serving TLS as the flags say (nil without TLS) and,
// until ctx ends, reloads the certificate files on SIGHUP: a SIGHUP never
// stops a server that serves TLS. -http-addr redirects to publicURL's
// host (-public-url, checked) when the request names none of the
// server's.
func startTLS(ctx context.Context, f *tlsserve.Flags, publicURL string, log *slog.Logger) (*tlsServer, error) {
	if !f.Enabled() {
		return nil, nil
	}
	cfg := &tlsserve.Config{Logger: log}
	if u, err := url.Parse(publicURL); err == nil {
		cfg.Host = u.Hostname()
	}
	s, err := tlsserve.New(f, cfg)
	if err != nil {
		return nil, err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading the TLS certificate")
				_ = s.Reload() // it logs the outcome
			}
		}
	}()
	return &tlsServer{s}, nil
}

// serve serves srv over TLS on ln and, when httpLn is not nil, the
// redirects and ACME HTTP-01 challenges on httpLn, which it returns the
// server of. Both keep the bounds of hl; their errors go to served.
func (t *tlsServer) serve(srv *http.Server, ln, httpLn net.Listener, hl *httpLimits, log *slog.Logger, served chan<- error) *http.Server {
	srv.Handler = t.HSTS(srv.Handler)
	srv.TLSConfig = t.TLSConfig()
	srv.ErrorLog = serverErrorLog(log)
	// ServeTLS adds h2 and http/1.1 to the protocols and wraps the
	// limited listener: the handshake counts against -max-conns and is
	// bounded by the read and write timeouts.
	go func() { served <- srv.ServeTLS(limitListener(ln, hl.maxConns), "", "") }()
	if httpLn == nil {
		return nil
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	redirects := &http.Server{Handler: t.HTTPHandler(port), ErrorLog: serverErrorLog(log)}
	hl.apply(redirects)
	go func() { served <- redirects.Serve(limitListener(httpLn, hl.maxConns)) }()
	answers := "redirects to https"
	if t.ACME() {
		answers = "ACME HTTP-01 challenges; redirects to https"
	}
	log.Info("plain HTTP listener", "http_addr", httpLn.Addr().String(), "answers", answers)
	return redirects
}

// serverErrorLog is an http.Server's ErrorLog into log: failed TLS
// handshakes (scanners, clients that do not trust the certificate) at
// debug, anything else at warn.
func serverErrorLog(log *slog.Logger) *stdlog.Logger {
	return stdlog.New(errorLogWriter{log}, "", 0)
}

type errorLogWriter struct{ log *slog.Logger }

func (w errorLogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.Contains(msg, "TLS handshake error") {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, msg)
	return len(p), nil
}
