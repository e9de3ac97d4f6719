package cmd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/waitfor"
)

// TestE2EWorkerRemovesTokenFile checks, with real processes, that a worker
// removes its -provisioning-token-file once it has registered and saved
// its worker token, so that whoever copies the file later registers
// nothing, and that -keep-token-file keeps it.
func TestE2EWorkerRemovesTokenFile(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	for _, tc := range []struct {
		node  string
		flags []string
		kept  bool
	}{
		{"drops-token", nil, false},
		{"keeps-token", []string{"-keep-token-file"}, true},
	} {
		p := c.startWorkerVia(tc.node, c.base(), tc.flags...)
		tokenFile := filepath.Join(c.dir, tc.node+".provisioning-token")
		c.workerID(tc.node)
		waitfor.Within(t, startTimeout, "worker "+tc.node+" to be done with its token file", func() bool {
			if p.exited() {
				t.Fatalf("worker %s exited: %s", tc.node, p.stderr.String())
			}
			if tc.kept {
				return strings.Contains(p.stderr.String(), "keeping the provisioning token file")
			}
			_, err := os.Stat(tokenFile)
			return errors.Is(err, fs.ErrNotExist)
		})
		_, err := os.Stat(tokenFile)
		if tc.kept && err != nil {
			t.Errorf("%s: -keep-token-file, but the token file: %v", tc.node, err)
		}
		// The identity holds the worker token: no provisioning token is needed.
		id, err := os.ReadFile(c.identityPath(tc.node))
		if err != nil || !strings.Contains(string(id), "nlc_") {
			t.Errorf("%s: the identity holds no worker token (%v)", tc.node, err)
		}
	}
}
