//go:build !linux

package command

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// errUnsupported: command jobs need Linux (process groups, /proc).
var errUnsupported = errors.New("command: command jobs run on Linux only")

// ShimArg is the hidden first argument of the command shim (Linux only).
const ShimArg = "__nodelane-command-shim"

// ShimMain is the command shim; commands run on Linux only.
func ShimMain(args []string) int { return 2 }

type group struct {
	stdout, stderr *os.File
	pgid           int
	leaderStart    uint64
	session        int
}

type exitInfo struct {
	code int
	sig  string
}

func startGroup(argv, env []string, dir, shim string, killGrace time.Duration, u *User) (*group, error) {
	return nil, errUnsupported
}

func (g *group) signal(sig syscall.Signal) {}
func (g *group) alive() bool               { return false }
func (g *group) wait() (exitInfo, error)   { return exitInfo{}, errUnsupported }
func (g *group) close()                    {}
func (g *group) shimPID() (int, uint64)    { return 0, 0 }
func leftovers(r RunRecord) []victim       { return nil }
func killProcess(v victim) bool            { return false }
func gone(v victim) bool                   { return true }
func processGone(pid int) bool             { return true }

func canRunAs(u *User) error               { return errUnsupported }
func handOver(dir string, u *User) error   { return errUnsupported }
func ownedBy(fi fs.FileInfo, u *User) bool { return false }
func nonDumpable() error                   { return nil }
