package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/nodelane/nodelane/workerapi/client"
)

// pinFlags is the repeatable -pin-sha256 flag.
type pinFlags []string

func (p *pinFlags) String() string { return strings.Join(*p, ",") }

func (p *pinFlags) Set(v string) error {
	*p = append(*p, v) // client.New checks each
	return nil
}

// transportFlags sets cfg's roots from the PEM file caFile and its dialer
// to connect, when they are given.
func transportFlags(cfg *client.Config, caFile, connect string) error {
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return fmt.Errorf("-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("-ca-file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if connect != "" {
		if _, _, err := net.SplitHostPort(connect); err != nil {
			return fmt.Errorf("-connect %q is not HOST:PORT: %w", connect, err)
		}
		var d net.Dialer
		cfg.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, connect)
		}
	}
	return nil
}
