package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// The environment variables nodelanectl reads.
const (
	envServer = "NODELANE_SERVER"
	envToken  = "NODELANE_TOKEN"
	envConfig = "NODELANE_CONFIG"
)

// defaultServer is the example server's default address.
const defaultServer = "http://127.0.0.1:8080"

// maxTokenFile and maxConfigFile bound what is read of those files.
const (
	maxTokenFile  = 4 << 10
	maxConfigFile = 64 << 10
)

// fileConfig is the config file.
type fileConfig struct {
	Server           string `toml:"server"`
	Token            string `toml:"token"`
	TokenFile        string `toml:"token_file"`
	ReceiptPublicKey string `toml:"receipt_public_key"`
	CAFile           string `toml:"ca_file"`
	InsecureHTTP     bool   `toml:"insecure_http"`
}

// settings are what the flags, the environment and the config file say,
// resolved.
type settings struct {
	server     string
	token      string
	receiptKey string
	configPath string
	// caFile names the roots to trust instead of the system's.
	caFile string
	// insecureHTTP allows a plain http server that is not this machine.
	insecureHTTP bool
}

// settings resolves the server, the token and the verifier key: a flag
// over the environment over the config file.
func (a *app) settings() (*settings, error) {
	if a.cfg != nil {
		return a.cfg, nil
	}
	path, explicit := a.common.config, true
	if path == "" {
		path = a.getenv(envConfig)
	}
	if path == "" {
		explicit = false
		dir := a.getenv("XDG_CONFIG_HOME")
		if dir == "" {
			home := a.getenv("HOME")
			if home == "" {
				home, _ = os.UserHomeDir()
			}
			dir = filepath.Join(home, ".config")
		}
		path = filepath.Join(dir, "nodelane", "nodelanectl.toml")
	}
	fc, err := readConfig(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		fc, err = &fileConfig{}, nil
	}
	if err != nil {
		return nil, err
	}
	s := &settings{configPath: path, receiptKey: fc.ReceiptPublicKey}
	s.server = firstOf(a.common.server, a.getenv(envServer), fc.Server, defaultServer)
	u, err := url.Parse(s.server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, &usageError{fmt.Sprintf("server %q is not an http:// or https:// base URL", s.server)}
	}
	s.server = strings.TrimRight(s.server, "/")
	s.insecureHTTP = a.common.insecureHTTP || fc.InsecureHTTP
	if u.Scheme == "http" && !s.insecureHTTP && !isLoopback(u.Hostname()) {
		return nil, &usageError{fmt.Sprintf("server %q is plain http to another machine: the operator token would cross the network in clear; use https, or -insecure-http (insecure_http = true in the config file) on a network you trust", s.server)}
	}
	s.caFile = firstOf(a.common.caFile, fc.CAFile)
	if s.caFile != "" && a.common.caFile == "" && !filepath.IsAbs(s.caFile) {
		s.caFile = filepath.Join(filepath.Dir(path), s.caFile)
	}
	switch {
	case a.common.tokenFile != "":
		s.token, err = a.readToken("-token-file", a.common.tokenFile)
	case strings.TrimSpace(a.getenv(envToken)) != "":
		s.token = strings.TrimSpace(a.getenv(envToken))
	case fc.Token != "":
		s.token = strings.TrimSpace(fc.Token)
	case fc.TokenFile != "":
		tf := fc.TokenFile
		if !filepath.IsAbs(tf) {
			tf = filepath.Join(filepath.Dir(path), tf)
		}
		s.token, err = a.readToken("token_file of "+path, tf)
	}
	if err != nil {
		return nil, err
	}
	a.cfg = s
	return s, nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// readConfig reads the config file. A file that holds a token must not
// be readable by other users than its owner. Errors never quote the
// file's content, which may hold a token.
func readConfig(path string) (*fileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(b) > maxConfigFile {
		return nil, fmt.Errorf("config file %s is over %d bytes", path, maxConfigFile)
	}
	var fc fileConfig
	md, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&fc)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("config file %s: line %d is not valid TOML", path, pe.Position.Line)
		}
		return nil, fmt.Errorf("config file %s: not a config: want string values for server, token, token_file, receipt_public_key and ca_file, and a boolean insecure_http", path)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("config file %s: unknown key %q (known: server, token, token_file, receipt_public_key, ca_file, insecure_http)", path, und[0].String())
	}
	if fc.Token != "" && runtime.GOOS != "windows" {
		if perm := st.Mode().Perm(); perm&0o077 != 0 {
			return nil, fmt.Errorf("config file %s holds a token and other users can read it (mode %04o): chmod 600 it", path, perm)
		}
	}
	return &fc, nil
}

// readToken reads a token file: one token, surrounding white space
// trimmed. It warns when other users can read the file.
func (a *app) readToken(what, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && runtime.GOOS != "windows" && st.Mode().Perm()&0o077 != 0 {
		fmt.Fprintf(a.stderr, "nodelanectl: warning: other users can read the token file %s (mode %04o): chmod 600 it\n", path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case len(b) > maxTokenFile:
		return "", fmt.Errorf("%s %s is over %d bytes: it should hold one token", what, path, maxTokenFile)
	case tok == "":
		return "", fmt.Errorf("%s %s is empty", what, path)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", fmt.Errorf("%s %s holds more than one word: it should hold one token", what, path)
	}
	return tok, nil
}

// isLoopback reports whether host (a URL's host name) is this machine.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback())
}

// httpClient is the operator client's HTTP client: TLS 1.2 at least,
// trusting the settings' CA file when there is one, through answerTap.
// It follows no redirect, as the operator client's own does not: a 3xx
// is an error naming its Location, and the bearer token goes nowhere the
// settings do not name.
func httpClient(s *settings) (*http.Client, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", s.caFile)
		}
		t.TLSClientConfig.RootCAs = pool
	}
	return &http.Client{Timeout: 60 * time.Second, Transport: answerTap{t},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, nil
}

// streamClient is httpClient for an answer that may take hours to read
// (an artifact's bytes): no deadline on the whole request, but 60 s for
// the answer's headers; the reader bounds the wait for each byte.
func streamClient(s *settings) (*http.Client, error) {
	hc, err := httpClient(s)
	if err != nil {
		return nil, err
	}
	t := hc.Transport.(answerTap).next.(*http.Transport)
	t.ResponseHeaderTimeout = hc.Timeout
	hc.Timeout = 0
	return hc, nil
}
