package cmd

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// unit is a systemd unit file: each key's values, in order, with
// continued lines joined.
type unit map[string][]string

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	var line string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if line == "" && (l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "[")) {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			line += strings.TrimSuffix(l, `\`) + " "
			continue
		}
		line += l
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		u[k] = append(u[k], strings.TrimSpace(v))
		line = ""
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// flagsOf lists the flags a binary's usage names.
func flagsOf(t *testing.T, bin string) []string {
	t.Helper()
	out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits non-zero
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	if len(flags) < 5 {
		t.Fatalf("%s -h names %d flags:\n%s", bin, len(flags), out)
	}
	return flags
}

// TestDeployUnits checks that the systemd units of cmd/deploy are
// hardened, hand the secrets over with LoadCredential, and pass only
// flags their binaries have. The server runs as a dynamic user with no
// capability; the worker as root with the five capabilities it needs to
// run its commands as nodelane-job (docs/COMMANDS.md §7), which the
// sysusers.d file creates, and so is rated more exposed.
func TestDeployUnits(t *testing.T) {
	t.Parallel()
	server, worker := binaries(t)
	for _, tc := range []struct {
		file, bin, credential string
		user                  map[string]string
		maxExposure           float64
	}{
		{"nodelane-server.service", server, "secrets.json", map[string]string{"DynamicUser": "yes"}, 2.0},
		{"nodelane-worker.service", worker, "provisioning-token", map[string]string{"User": "root",
			"CapabilityBoundingSet": "CAP_SETUID CAP_SETGID CAP_CHOWN CAP_DAC_OVERRIDE CAP_KILL", "AmbientCapabilities": ""}, 3.2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			u := readUnit(t, filepath.Join("deploy", tc.file))
			for k, want := range tc.user {
				if got := u[k]; len(got) != 1 || got[0] != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
			for k, want := range map[string]string{
				"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
				"PrivateTmp": "yes", "RestrictSUIDSGID": "yes", "UMask": "0077",
			} {
				if got := u[k]; len(got) != 1 || got[0] != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
			if got := u["LoadCredential"]; len(got) != 1 || !strings.HasPrefix(got[0], tc.credential+":/etc/nodelane/") {
				t.Errorf("LoadCredential=%q, want %s from /etc/nodelane", got, tc.credential)
			}
			exec := strings.Fields(u["ExecStart"][0])
			if !strings.HasPrefix(exec[0], "/usr/local/bin/nodelane-") {
				t.Errorf("ExecStart runs %s", exec[0])
			}
			have := flagsOf(t, tc.bin)
			var usesCredential bool
			for i, arg := range exec[1:] {
				if name, ok := strings.CutPrefix(arg, "-"); ok {
					if !slices.Contains(have, name) {
						t.Errorf("ExecStart passes -%s, which %s does not have", name, filepath.Base(tc.bin))
					}
					continue
				}
				if arg == "%d/"+tc.credential {
					usesCredential = true
				}
				if i == 0 || !strings.HasPrefix(exec[i], "-") {
					t.Errorf("ExecStart argument %q follows no flag", arg)
				}
			}
			if !usesCredential {
				t.Errorf("ExecStart does not read the credential as %%d/%s", tc.credential)
			}
			analyze(t, tc.file, tc.bin, tc.maxExposure)
		})
	}
}

// TestDeploySysusers checks that the sysusers.d file of cmd/deploy
// creates nodelane-job, an unprivileged user with no login, which the
// worker's unit tells worker.toml to run the commands as.
func TestDeploySysusers(t *testing.T) {
	t.Parallel()
	conf, err := filepath.Abs(filepath.Join("deploy", "nodelane-worker.sysusers.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join("deploy", "nodelane-worker.service")); err != nil || !strings.Contains(string(b), `user = "nodelane-job"`) {
		t.Errorf("the worker's unit does not name user = \"nodelane-job\" (%v)", err)
	}
	su, err := exec.LookPath("systemd-sysusers")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs systemd-sysusers: %v", err)
		}
		t.Logf("no systemd-sysusers: %s is not checked", conf)
		return
	}
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(su, "--root="+root, conf).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^nodelane-job:x:([0-9]+):[0-9]+:[^:]*:/nonexistent:/usr/sbin/nologin$`).FindSubmatch(passwd)
	if m == nil {
		t.Fatalf("no nodelane-job in /etc/passwd after systemd-sysusers:\n%s", passwd)
	}
	if uid, _ := strconv.Atoi(string(m[1])); uid == 0 {
		t.Errorf("nodelane-job is uid 0:\n%s", passwd)
	}
}

// analyze has systemd-analyze verify the unit (run as the built binary)
// and rate its exposure offline: at most maxExposure.
func analyze(t *testing.T, file, bin string, maxExposure float64) {
	t.Helper()
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs systemd-analyze: %v", err)
		}
		t.Logf("no systemd-analyze: the units are not verified")
		return
	}
	text, err := os.ReadFile(filepath.Join("deploy", file))
	if err != nil {
		t.Fatal(err)
	}
	text = []byte(strings.Replace(string(text), "/usr/local/bin/"+strings.TrimSuffix(file, ".service"), bin, 1))
	path := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(sa, "security", "--offline=true", "--no-pager", path).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	if got, _ := strconv.ParseFloat(string(m[1]), 64); got > maxExposure {
		t.Errorf("systemd-analyze rates %s's exposure %.1f, more than %.1f:\n%s", file, got, maxExposure, out)
	}
}

// TestStaticBuild checks that the example binaries build static with
// CGO_ENABLED=0 (the SQLite driver is pure Go): no interpreter, no shared
// library.
func TestStaticBuild(t *testing.T) {
	t.Parallel()
	server, worker := binaries(t)
	for _, bin := range []string{server, worker} {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s has a %v program header: it is dynamically linked", filepath.Base(bin), p.Type)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("%s imports %v (%v)", filepath.Base(bin), libs, err)
		}
	}
}
