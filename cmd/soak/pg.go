package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// cluster is a throwaway PostgreSQL cluster on a port of 127.0.0.1, with
// trust authentication, in a directory of its own.
type cluster struct {
	bin  string // initdb, pg_ctl
	dir  string // removed by stop
	data string
	port int
	cred *syscall.Credential // the postgres user's, when run as root
}

// startCluster initialises and starts a cluster in a new temporary
// directory. initdb refuses to run as root, so as root the cluster is the
// postgres user's.
func startCluster(ctx context.Context, bin string) (*cluster, error) {
	dir, err := os.MkdirTemp("", "nodelane-soak-pg-")
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, the cluster needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if c.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if _, err := c.cmd(ctx, "initdb", "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if _, err := c.pgctl(ctx, "start"); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// dsn is the cluster's postgres database.
func (c *cluster) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// restart crashes the cluster (-m immediate: no checkpoint, recovery on
// start) and starts it again.
func (c *cluster) restart(ctx context.Context) error {
	_, err := c.pgctl(ctx, "restart", "-m", "immediate")
	return err
}

// stop stops the cluster, at once, and removes its directory.
func (c *cluster) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.pgctl(ctx, "stop", "-m", "immediate")
	if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func (c *cluster) pgctl(ctx context.Context, action string, args ...string) ([]byte, error) {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c max_connections=300", c.port, c.dir)
	a := append([]string{action, "-D", c.data, "-l", filepath.Join(c.dir, "postgres.log"), "-w", "-t", "60", "-o", opts}, args...)
	return c.cmd(ctx, "pg_ctl", a...)
}

// cmd runs one of the cluster's programs as its owner.
func (c *cluster) cmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w\n%s", name, args[0], err, tail(out.Bytes(), 2000))
	}
	return out.Bytes(), nil
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
