package command

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg, err := Parse(`
tags = ["a100", "eu", "a100"]

[[job]]
type = "lora_train"
command = ["sh", "-c", "echo hi"]
gpus = 2
timeout = "6h"
kill_grace = "30s"
env_pass = ["HF_HOME", "HF_HOME"]
retry_on_exit = [75]
workdir = "."

[[job]]
type = "embed"
command = ["bin/embed", "--fast"]
`, dir)
	if err != nil {
		t.Fatal(err)
	}
	sh, _ := exec.LookPath("sh")
	sh, _ = filepath.Abs(sh)
	if got := strings.Join(cfg.Tags, ","); got != "a100,eu" {
		t.Errorf("tags %q", got)
	}
	j := cfg.Jobs[0]
	if j.Type != "lora_train" || j.Command[0] != sh || j.GPUs != 2 || j.Timeout != 6*time.Hour || j.KillGrace != 30*time.Second ||
		strings.Join(j.EnvPass, ",") != "HF_HOME" || len(j.RetryOnExit) != 1 || j.Workdir != dir {
		t.Errorf("job 1: %+v", j)
	}
	j = cfg.Jobs[1]
	if j.Command[0] != filepath.Join(dir, "bin/embed") || j.GPUs != -1 || j.Timeout != 0 || j.KillGrace != DefaultKillGrace || j.Workdir != "" {
		t.Errorf("job 2 defaults: %+v", j)
	}
	if got := strings.Join(cfg.Types(), ","); got != "lora_train,embed" {
		t.Errorf("types %q", got)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	job := func(body string) string { return "[[job]]\n" + body + "\n" }
	ok := `type = "x"` + "\n" + `command = ["/bin/true"]` + "\n"
	tests := []struct {
		name, text, want string
	}{
		{"no job", `tags = ["a"]`, "no [[job]]"},
		{"missing type", job(`command = ["/bin/true"]`), "type is required"},
		{"long type", job(`type = "` + strings.Repeat("t", 129) + `"` + "\ncommand = [\"/bin/true\"]"), "over 128"},
		{"empty command", job(`type = "x"` + "\ncommand = []"), "command is required"},
		{"no command", job(`type = "x"`), "command is required"},
		{"empty argv0", job(`type = "x"` + "\ncommand = [\"\"]"), "command is required"},
		{"command a string", job(`type = "x"` + "\ncommand = \"sh -c x\""), "incompatible"},
		{"unknown job key", job(ok + `shell = true`), "unknown keys job.shell"},
		{"unknown top key", "nodes = 3\n" + job(ok), "unknown keys nodes"},
		{"bad timeout", job(ok + `timeout = "ten minutes"`), "timeout"},
		{"number timeout", job(ok + `timeout = 10`), "incompatible"},
		{"negative timeout", job(ok + `timeout = "-1s"`), "must be positive"},
		{"zero kill_grace", job(ok + `kill_grace = "0s"`), "must be positive"},
		{"negative gpus", job(ok + `gpus = -1`), "gpus is -1"},
		{"too many gpus", job(ok + `gpus = 65`), "gpus is 65"},
		{"duplicate type", job(ok) + job(ok), "configured twice"},
		{"reserved env", job(ok + `env_pass = ["CUDA_VISIBLE_DEVICES"]`), "set by the worker"},
		{"reserved env prefix", job(ok + `env_pass = ["NODELANE_JOB_ID"]`), "set by the worker"},
		{"bad env name", job(ok + `env_pass = ["A=B"]`), "not a variable name"},
		{"bad exit code", job(ok + `retry_on_exit = [0]`), "not an exit code"},
		{"big exit code", job(ok + `retry_on_exit = [256]`), "not an exit code"},
		{"workdir missing", job(ok + `workdir = "nope"`), "workdir"},
		{"workdir a file", job(ok + `workdir = "file"`), "not a directory"},
		{"empty tag", `tags = [""]` + "\n" + job(ok), "tag"},
		{"bad toml", "[[job]\n", "toml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.text, dir)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("%v does not wrap ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	if _, err := Parse(job(`type = "x"`+"\n"+`command = ["no-such-command-nodelane"]`), dir); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing command: %v", err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "worker.toml")
	if err := os.WriteFile(path, []byte("[[job]]\ntype = \"x\"\ncommand = [\"./run.sh\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Jobs[0].Command[0] != filepath.Join(dir, "run.sh") {
		t.Errorf("relative command resolved to %s", cfg.Jobs[0].Command[0])
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, []byte(strings.Repeat("# padding\n", MaxConfigBytes/10+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); !errors.Is(err, ErrConfig) {
		t.Errorf("oversized file: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
