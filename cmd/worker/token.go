package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strings"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// provisioningEnv is the environment variable the provisioning token may
// be given in when -provisioning-token-file is not.
const provisioningEnv = "NODELANE_PROVISIONING_TOKEN"

// maxTokenFile bounds what is read of a token file: a token is 75 bytes.
const maxTokenFile = 4 << 10

// provisioningToken returns the provisioning token: the content of path
// (surrounding white space trimmed) when path is set, else the value of
// $NODELANE_PROVISIONING_TOKEN, or "" when neither gives one. The
// variable is removed from the process's environment once read, so that
// no process the worker starts inherits it. The token is never taken from
// the command line, which every local user can read.
func provisioningToken(path string) (string, error) {
	env := strings.TrimSpace(os.Getenv(provisioningEnv))
	if err := os.Unsetenv(provisioningEnv); err != nil {
		return "", err
	}
	if path == "" {
		return env, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("-provisioning-token-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("-provisioning-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case len(b) > maxTokenFile:
		return "", fmt.Errorf("-provisioning-token-file %s is over %d bytes: it should hold one token", path, maxTokenFile)
	case tok == "":
		return "", fmt.Errorf("-provisioning-token-file %s is empty", path)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", errors.New("-provisioning-token-file " + path + " holds more than one word: it should hold one token")
	}
	return tok, nil
}

// warnIfShared warns when the token file may be read by users other than
// its owner.
func warnIfShared(log *slog.Logger, path string) {
	st, err := os.Stat(path)
	if err != nil || runtime.GOOS == "windows" {
		return
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		log.Warn("the provisioning token file can be read by other users: chmod 600 it", "path", path, "mode", fmt.Sprintf("%04o", perm))
	}
}

// dropTokenFile is the RunnerConfig.Registered of a worker given
// -provisioning-token-file: once a registration's worker token is saved
// in the identity, the provisioning token is no longer needed on the
// machine (the worker renews its own token), so the file is removed,
// unless keep (-keep-token-file) says the file is managed elsewhere.
// Whoever copies the file later then finds no token that registers new
// nodes.
func dropTokenFile(log *slog.Logger, path string, keep bool) func(wire.RegisterResponse) {
	return func(wire.RegisterResponse) {
		if keep {
			log.Info("registered: keeping the provisioning token file (-keep-token-file)", "path", path)
			return
		}
		switch err := os.Remove(path); {
		case errors.Is(err, fs.ErrNotExist):
			// Removed after an earlier registration of this run.
		case err != nil:
			log.Warn("registered, but the provisioning token file could not be removed: remove it", "path", path, "err", err)
		default:
			log.Info("registered: removed the provisioning token file", "path", path)
		}
	}
}
