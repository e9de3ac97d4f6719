package cmd

// The nginx and Caddy configurations of docs/PROXY.md, run as documented
// through the real proxies on loopback, so that the page cannot drift from
// what works. Each block is found by its `<!-- config: NAME -->` marker and
// changed only by the substitutions of loopbackConfig (a loopback listener
// in place of the TLS one, the server's address in place of
// 127.0.0.1:8080); every other directive is used as written.

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/internal/waitfor"
)

// proxyTimeout bounds the wait for a proxy to listen and to stop.
const proxyTimeout = 20 * time.Second

// docBlock returns the fenced block that follows `<!-- config: name -->` in
// docs/PROXY.md, and its info string (nginx, caddyfile).
func docBlock(t *testing.T, name string) (lang, body string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "PROXY.md"))
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- config: " + name + " -->\n"
	if n := strings.Count(string(b), marker); n != 1 {
		t.Fatalf("docs/PROXY.md has %d markers %q, want 1", n, strings.TrimSpace(marker))
	}
	_, rest, _ := strings.Cut(string(b), marker)
	m := regexp.MustCompile("(?s)^```([a-z]+)\n(.*?\n)```\n").FindStringSubmatch(rest)
	if m == nil {
		t.Fatalf("docs/PROXY.md: no fenced block right after %q", strings.TrimSpace(marker))
	}
	return m[1], m[2]
}

// loopbackConfig turns a documented block into one that runs on loopback,
// by these substitutions only, each of which must apply:
//
//   - nginx: `listen 443 ssl;` becomes `listen 127.0.0.1:PORT;`, and the
//     lines `ssl_certificate…` and `# ssl_certificate … as above` are
//     dropped (plain HTTP in place of TLS);
//   - Caddy: the site address `cp.example.com {` becomes
//     `http://127.0.0.1:PORT {` followed by `bind 127.0.0.1` (Caddy 2.6
//     would listen on every interface otherwise);
//   - both: the upstream 127.0.0.1:8080 becomes the server's address.
func loopbackConfig(t *testing.T, lang, block, listen, upstream string) string {
	t.Helper()
	replace := func(s, old, new string) string {
		if !strings.Contains(s, old) {
			t.Fatalf("the %s block has no %q: update the test's substitutions with the doc", lang, old)
		}
		return strings.ReplaceAll(s, old, new)
	}
	switch lang {
	case "nginx":
		block = replace(block, "listen 443 ssl;", "listen "+listen+";")
		var kept []string
		dropped := 0
		for line := range strings.Lines(block) {
			l := strings.TrimSpace(line)
			if strings.HasPrefix(l, "ssl_certificate") || l == "# ssl_certificate … as above" {
				dropped++
				continue
			}
			kept = append(kept, line)
		}
		if dropped == 0 {
			t.Fatal("the nginx block has no ssl_certificate line: update the test's substitutions with the doc")
		}
		block = strings.Join(kept, "")
	case "caddyfile":
		block = replace(block, "cp.example.com {", "http://"+listen+" {\n    bind 127.0.0.1")
	default:
		t.Fatalf("no substitutions for a %q block", lang)
	}
	return replace(block, "127.0.0.1:8080", upstream)
}

// needProxy returns the path of the proxy's binary. Under CI (CI set) a
// missing binary fails the test: .ci/run installs nginx and caddy.
func needProxy(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	// Debian installs nginx in /usr/sbin, not on every user's PATH.
	if fi, statErr := os.Stat(filepath.Join("/usr/sbin", name)); statErr == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return filepath.Join("/usr/sbin", name)
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed (CI is set, so this fails rather than skips): %v", name, err)
	}
	t.Skipf("%s is not installed (apt-get install nginx caddy); docs/PROXY.md's %s blocks are not checked", name, name)
	return ""
}

// startProxy runs the block as the real proxy listening on listen (a
// 127.0.0.1:PORT address) and waits until it accepts connections. The
// proxy runs in its own process group, stopped (SIGTERM, then SIGKILL) at
// cleanup; its output is logged if the test failed.
func startProxy(t *testing.T, lang, config, listen string) {
	t.Helper()
	dir := t.TempDir()
	var p *proc
	switch lang {
	case "nginx":
		bin := needProxy(t, "nginx")
		// Every temporary path under dir; as root, nginx's workers would
		// otherwise switch to nobody, who cannot write there.
		var user string
		if os.Geteuid() == 0 {
			user = "user root;\n"
		}
		conf := user + "events {}\nhttp {\n    access_log off;\n" +
			"    client_body_temp_path " + filepath.Join(dir, "body") + ";\n" +
			"    proxy_temp_path " + filepath.Join(dir, "proxy") + ";\n" +
			"    fastcgi_temp_path " + filepath.Join(dir, "fastcgi") + ";\n" +
			"    uwsgi_temp_path " + filepath.Join(dir, "uwsgi") + ";\n" +
			"    scgi_temp_path " + filepath.Join(dir, "scgi") + ";\n" +
			config + "}\n"
		file := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		p = startGroupProc(t, "nginx", bin, nil, "-e", "stderr", "-p", dir, "-c", file,
			"-g", "daemon off; error_log stderr; pid "+filepath.Join(dir, "nginx.pid")+";")
	case "caddyfile":
		bin := needProxy(t, "caddy")
		conf := "{\n    admin off\n    auto_https off\n}\n\n" + config
		file := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		p = startGroupProc(t, "caddy", bin, []string{"HOME=" + dir, "XDG_DATA_HOME=" + filepath.Join(dir, "data"),
			"XDG_CONFIG_HOME=" + filepath.Join(dir, "config")}, "run", "--config", file, "--adapter", "caddyfile")
	default:
		t.Fatalf("no proxy for a %q block", lang)
	}
	waitfor.Within(t, proxyTimeout, p.name+" to listen on "+listen, func() bool {
		if p.exited() {
			t.Fatalf("%s exited: %v\n%s\nconfig:\n%s", p.name, p.cmd.ProcessState, p.stderr.String(), config)
		}
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// startGroupProc is startProc in a process group of its own, so that
// nginx's worker processes stop with it: SIGTERM to the group at cleanup,
// SIGKILL if it is not gone within proxyTimeout.
func startGroupProc(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(proxyTimeout):
			t.Errorf("%s did not stop within %v of SIGTERM", name, proxyTimeout)
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // the group's stragglers, if any
		<-p.done
		if t.Failed() || os.Getenv("NODELANE_E2E_LOGS") != "" {
			t.Logf("--- %s stdout:\n%s\n--- %s stderr:\n%s", name, p.stdout.String(), name, p.stderr.String())
		}
	})
	return p
}

// TestProxyDocs runs docs/PROXY.md's nginx and Caddy configurations. For
// each proxy, on one control plane (restarted once, on the same address):
//
//  1. without -public-url, a worker through the "unchanged" block
//     registers and completes a job;
//  2. still without -public-url, a worker through the "stripped" block
//     (Host rewritten, /nodelane stripped) is refused 401 bad_signature,
//     told which @authority and @path it signed and the server verified;
//  3. restarted with -public-url set to the stripped block's URL, a worker
//     through it completes a job.
func TestProxyDocs(t *testing.T) {
	t.Parallel()
	for _, proxy := range []string{"nginx", "caddy"} {
		t.Run(proxy, func(t *testing.T) {
			t.Parallel()
			testProxyDocs(t, proxy)
		})
	}
}

func testProxyDocs(t *testing.T, proxy string) {
	needProxy(t, proxy)
	c := newCluster(t)

	lang, block := docBlock(t, proxy+"-unchanged")
	unchanged := freeAddr(t)
	startProxy(t, lang, loopbackConfig(t, lang, block, unchanged, c.addr), unchanged)
	lang, block = docBlock(t, proxy+"-stripped")
	stripped := freeAddr(t)
	startProxy(t, lang, loopbackConfig(t, lang, block, stripped, c.addr), stripped)
	public := "http://" + stripped + "/nodelane"

	// 1. Host and path unchanged, no setting.
	w1 := c.startWorkerVia("node-unchanged", "http://"+unchanged)
	c.runJobOn("node-unchanged")

	// 2. Host rewritten and prefix stripped, no -public-url: refused, and
	// the message names both components and both values.
	w2 := c.startWorkerVia("node-refused", public)
	want := []string{"401 bad_signature", "signed for @authority", stripped, "@path",
		"/nodelane/workers/register", "this server verifies", c.addr, "/workers/register", "-public-url"}
	waitfor.Within(c.t, startTimeout, "the worker behind the stripped block to report the refusal", func() bool {
		out := w2.stderr.String()
		for _, s := range want {
			if !strings.Contains(out, s) {
				return false
			}
		}
		return true
	})
	w2.kill()
	w1.kill() // it signs the unchanged block's @authority, refused after the restart

	// 3. The same proxy, the server told the public URL.
	c.server.kill()
	c.serverArgs = append(c.serverArgs, "-public-url", public, "-trusted-proxy", "127.0.0.1")
	c.startServer()
	w3 := c.startWorkerVia("node-stripped", public)
	c.runJobOn("node-stripped")
	if w3.exited() {
		t.Fatalf("the worker exited: %s", w3.stderr.String())
	}
	c.checkNoTokensLogged()
}

// runJobOn dispatches a status_check and checks that node's worker, the
// only one running, completed it.
func (c *cluster) runJobOn(node string) {
	c.t.Helper()
	wid := c.workerID(node)
	d := c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded")
	if d.Job.WorkerID == nil || *d.Job.WorkerID != wid {
		c.t.Fatalf("the job ran on %v, want %s's worker %s", d.Job.WorkerID, node, wid)
	}
	c.checkSucceeded(d)
}
