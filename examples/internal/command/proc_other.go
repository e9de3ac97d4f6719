//go:build !linux

package command

import (
	"errors"
	"os"
	"syscall"
)

// errUnsupported: command jobs need Linux (process groups, /proc).
var errUnsupported = errors.New("command: command jobs run on Linux only")

type group struct {
	stdout, stderr *os.File
	pgid           int
}

func startGroup(argv, env []string, dir string) (*group, error) { return nil, errUnsupported }

func (g *group) signal(sig syscall.Signal)       {}
func (g *group) alive() bool                     { return false }
func (g *group) wait() (*os.ProcessState, error) { return nil, errUnsupported }

func processGone(pid int) bool { return true }

func exitStatus(ps *os.ProcessState) (int, string) { return ps.ExitCode(), "" }
