// Package command runs a worker's jobs as local processes: a TOML file
// maps each job type to a command line (argv, no shell), and every job of
// that type runs the command in its own process group, with a scrubbed
// environment, the GPUs it was given (CUDA_VISIBLE_DEVICES), its output
// lines turned into log lines, status events and artifacts, and its exit
// status turned into the job's completion or failure. docs/COMMANDS.md is
// the contract a script writer needs.
//
// cmd/worker uses it with -config:
//
//	tags = ["gpu-a100"]
//	user = "nodelane-job"
//
//	[[job]]
//	type = "lora_train"
//	command = ["python3", "/opt/train/train.py"]
//	gpus = 1
//	timeout = "6h"
//	kill_grace = "30s"
//	env_pass = ["HF_HOME"]
//	retry_on_exit = [75]
package command

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// DefaultKillGrace is how long a job's process group has, after SIGTERM,
// before it is sent SIGKILL, when its kill_grace is not set.
const DefaultKillGrace = 10 * time.Second

// Limits of a configuration file.
const (
	// MaxConfigBytes bounds the file Load reads.
	MaxConfigBytes = 1 << 20
	// MaxArgs bounds a command's argv.
	MaxArgs = 1024
	// MaxEnvPass bounds a job's env_pass names.
	MaxEnvPass = 256
)

// ErrConfig is wrapped by every error Load and Parse return for a
// configuration that is not valid.
var ErrConfig = errors.New("command: invalid configuration")

// Config is a worker's command configuration: one Job per job type.
type Config struct {
	// Tags are the worker's registration tags (top-level tags = [...]).
	Tags []string
	// User is the user the commands run as (top-level user = "..."); nil
	// means the worker's own.
	User *User
	// Jobs are the [[job]] tables, in file order.
	Jobs []*Job
}

// Job says how the jobs of one type run.
type Job struct {
	// Type is the job type.
	Type string
	// Command is the argv; Command[0] is an absolute path once loaded
	// (a bare name is looked up in the worker's PATH, a relative path is
	// taken from the configuration file's directory).
	Command []string
	// GPUs is how many GPUs a job takes; -1 (gpus absent) means the
	// job's requirements.gpu_count.
	GPUs int
	// Timeout bounds a job's run; 0 means none (the control plane's
	// max_runtime still applies).
	Timeout time.Duration
	// KillGrace is how long the process group has between SIGTERM and
	// SIGKILL. Defaults to DefaultKillGrace.
	KillGrace time.Duration
	// EnvPass names the worker's environment variables passed to the
	// process (those set).
	EnvPass []string
	// RetryOnExit lists the exit codes that fail the job as retryable.
	RetryOnExit []int
	// Workdir is the process's working directory (absolute once loaded);
	// empty means the job's own run directory.
	Workdir string
}

// User is a local user the commands run as: its ids as the system's user
// database gave them when the configuration was loaded.
type User struct {
	Name string
	UID  uint32
	GID  uint32
	// Groups are its supplementary groups.
	Groups []uint32
	// Home is its home directory, the commands' HOME.
	Home string
}

// fileConfig is the file's shape.
type fileConfig struct {
	Tags []string  `toml:"tags"`
	User *string   `toml:"user"`
	Job  []fileJob `toml:"job"`
}

type fileJob struct {
	Type        string   `toml:"type"`
	Command     []string `toml:"command"`
	GPUs        *int     `toml:"gpus"`
	Timeout     *string  `toml:"timeout"`
	KillGrace   *string  `toml:"kill_grace"`
	EnvPass     []string `toml:"env_pass"`
	RetryOnExit []int    `toml:"retry_on_exit"`
	Workdir     string   `toml:"workdir"`
}

// Load reads and validates the configuration file at path. Relative
// paths in it (a command with a slash, a workdir) are taken from the
// file's directory.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("command: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("command: reading %s: %w", path, err)
	}
	if len(b) > MaxConfigBytes {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrConfig, path, MaxConfigBytes)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("command: %w", err)
	}
	cfg, err := Parse(string(b), filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Parse validates a configuration held in text; dir (absolute) is where
// relative paths are taken from. Every error wraps ErrConfig, except one
// for a command that cannot be found (exec.ErrNotFound).
func Parse(text, dir string) (*Config, error) {
	var fc fileConfig
	md, err := toml.Decode(text, &fc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("%w: unknown keys %s", ErrConfig, strings.Join(keys, ", "))
	}
	cfg := &Config{}
	if len(fc.Tags) > wire.MaxTags {
		return nil, fmt.Errorf("%w: %d tags, at most %d", ErrConfig, len(fc.Tags), wire.MaxTags)
	}
	for _, t := range fc.Tags {
		if t == "" || len(t) > wire.MaxTagBytes {
			return nil, fmt.Errorf("%w: tag %q is empty or over %d bytes", ErrConfig, t, wire.MaxTagBytes)
		}
		if !slices.Contains(cfg.Tags, t) {
			cfg.Tags = append(cfg.Tags, t)
		}
	}
	if fc.User != nil {
		if cfg.User, err = lookupUser(*fc.User); err != nil {
			return nil, err
		}
	}
	if len(fc.Job) == 0 {
		return nil, fmt.Errorf("%w: no [[job]] table", ErrConfig)
	}
	if len(fc.Job) > wire.MaxJobTypes {
		return nil, fmt.Errorf("%w: %d job tables, at most %d", ErrConfig, len(fc.Job), wire.MaxJobTypes)
	}
	seen := map[string]bool{}
	for i, fj := range fc.Job {
		j, err := fj.validate(dir)
		if err != nil {
			name := fmt.Sprintf("job %d", i+1)
			if fj.Type != "" {
				name = fmt.Sprintf("job %d (%s)", i+1, fj.Type)
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if seen[j.Type] {
			return nil, fmt.Errorf("%w: job type %s is configured twice", ErrConfig, j.Type)
		}
		seen[j.Type] = true
		cfg.Jobs = append(cfg.Jobs, j)
	}
	return cfg, nil
}

// Types returns the configured job types, in file order.
func (c *Config) Types() []string {
	out := make([]string, len(c.Jobs))
	for i, j := range c.Jobs {
		out[i] = j.Type
	}
	return out
}

// lookupUser looks name up in the system's user database. Root is
// refused: commands run as another user so that they have less than the
// worker.
func lookupUser(name string) (*User, error) {
	if name == "" || strings.ContainsAny(name, "\x00/:") {
		return nil, fmt.Errorf("%w: user %q is not a user name", ErrConfig, name)
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: user %q: %v", ErrConfig, name, err)
	}
	id := func(what, s string) (uint32, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%w: user %q has %s %q, not a number", ErrConfig, name, what, s)
		}
		return uint32(n), nil
	}
	out := &User{Name: name, Home: u.HomeDir}
	if out.UID, err = id("uid", u.Uid); err != nil {
		return nil, err
	}
	if out.GID, err = id("gid", u.Gid); err != nil {
		return nil, err
	}
	if out.UID == 0 {
		return nil, fmt.Errorf("%w: user %q is root: name an unprivileged user the commands run as", ErrConfig, name)
	}
	gids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("%w: user %q: its groups: %v", ErrConfig, name, err)
	}
	for _, g := range gids {
		n, err := id("group", g)
		if err != nil {
			return nil, err
		}
		if n != out.GID && !slices.Contains(out.Groups, n) {
			out.Groups = append(out.Groups, n)
		}
	}
	return out, nil
}

// reserved are the variables the worker sets itself.
func reserved(name string) bool {
	return strings.HasPrefix(name, "NODELANE_") || name == "CUDA_VISIBLE_DEVICES" || name == "CUDA_DEVICE_ORDER" || name == "PATH" || name == "HOME" || name == "LANG"
}

func (fj fileJob) validate(dir string) (*Job, error) {
	j := &Job{Type: fj.Type, GPUs: -1, KillGrace: DefaultKillGrace, RetryOnExit: slices.Clone(fj.RetryOnExit)}
	switch {
	case fj.Type == "":
		return nil, fmt.Errorf("%w: type is required", ErrConfig)
	case len(fj.Type) > wire.MaxJobTypeBytes:
		return nil, fmt.Errorf("%w: type is over %d bytes", ErrConfig, wire.MaxJobTypeBytes)
	case len(fj.Command) == 0 || fj.Command[0] == "":
		return nil, fmt.Errorf("%w: command is required: an argv array such as [\"python3\", \"train.py\"]", ErrConfig)
	case len(fj.Command) > MaxArgs:
		return nil, fmt.Errorf("%w: command has %d arguments, at most %d", ErrConfig, len(fj.Command), MaxArgs)
	}
	for _, a := range fj.Command {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("%w: command holds a NUL byte", ErrConfig)
		}
	}
	j.Command = slices.Clone(fj.Command)
	switch name := fj.Command[0]; {
	case filepath.IsAbs(name):
	case strings.ContainsRune(name, '/'):
		j.Command[0] = filepath.Join(dir, name)
	default:
		p, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("command %s: %w", name, err)
		}
		if p, err = filepath.Abs(p); err != nil {
			return nil, fmt.Errorf("command %s: %w", name, err)
		}
		j.Command[0] = p
	}
	if fj.GPUs != nil {
		if *fj.GPUs < 0 || *fj.GPUs > wire.MaxGPUs {
			return nil, fmt.Errorf("%w: gpus is %d, want 0 to %d", ErrConfig, *fj.GPUs, wire.MaxGPUs)
		}
		j.GPUs = *fj.GPUs
	}
	for _, d := range []struct {
		key  string
		v    *string
		dst  *time.Duration
		zero bool
	}{{"timeout", fj.Timeout, &j.Timeout, true}, {"kill_grace", fj.KillGrace, &j.KillGrace, false}} {
		if d.v == nil {
			continue
		}
		v, err := time.ParseDuration(*d.v)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: %s %q is not a duration such as \"90s\" or \"2h\"", ErrConfig, d.key, *d.v)
		case v < 0 || (v == 0 && !d.zero):
			return nil, fmt.Errorf("%w: %s %q must be positive", ErrConfig, d.key, *d.v)
		}
		*d.dst = v
	}
	if len(fj.EnvPass) > MaxEnvPass {
		return nil, fmt.Errorf("%w: env_pass has %d names, at most %d", ErrConfig, len(fj.EnvPass), MaxEnvPass)
	}
	for _, n := range fj.EnvPass {
		switch {
		case n == "" || strings.ContainsAny(n, "=\x00"):
			return nil, fmt.Errorf("%w: env_pass name %q is not a variable name", ErrConfig, n)
		case reserved(n):
			return nil, fmt.Errorf("%w: env_pass name %s is set by the worker itself", ErrConfig, n)
		}
		if !slices.Contains(j.EnvPass, n) {
			j.EnvPass = append(j.EnvPass, n)
		}
	}
	for _, c := range fj.RetryOnExit {
		if c < 1 || c > 255 {
			return nil, fmt.Errorf("%w: retry_on_exit code %d is not an exit code from 1 to 255", ErrConfig, c)
		}
	}
	if fj.Workdir != "" {
		j.Workdir = fj.Workdir
		if !filepath.IsAbs(j.Workdir) {
			j.Workdir = filepath.Join(dir, j.Workdir)
		}
		fi, err := os.Stat(j.Workdir)
		if err != nil {
			return nil, fmt.Errorf("%w: workdir: %v", ErrConfig, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%w: workdir %s is not a directory", ErrConfig, j.Workdir)
		}
	}
	return j, nil
}
