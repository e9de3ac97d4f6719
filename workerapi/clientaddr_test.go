package workerapi

import (
	"net/http"
	"net/netip"
	"testing"
)

// The client address logged: the peer's, unless the peer is a trusted
// proxy; then the right-most X-Forwarded-For entry that is not one.
func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted, err := checkTrustedProxies([]netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("::ffff:192.168.1.0/120"), // an IPv4-mapped prefix: compared unmapped
		netip.MustParsePrefix("fd00::/8"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		remote string
		xff    []string
		want   string
	}{
		{"untrusted peer, no header", "203.0.113.7:5555", nil, "203.0.113.7"},
		{"untrusted peer spoofs X-Forwarded-For", "203.0.113.7:5555", []string{"198.51.100.1"}, "203.0.113.7"},
		{"untrusted peer spoofs a trusted address", "203.0.113.7:5555", []string{"10.0.0.9"}, "203.0.113.7"},
		{"trusted proxy", "10.0.0.2:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"a client's own spoofed entry to the left is ignored", "10.0.0.2:80", []string{"1.2.3.4, 198.51.100.1"}, "198.51.100.1"},
		{"two trusted proxies", "10.0.0.2:80", []string{"1.2.3.4, 198.51.100.1, 10.0.0.3"}, "198.51.100.1"},
		{"several field lines", "10.0.0.2:80", []string{"1.2.3.4", "198.51.100.1", "10.0.0.3"}, "198.51.100.1"},
		{"every hop trusted", "10.0.0.2:80", []string{"10.1.1.1, 10.0.0.3"}, "10.1.1.1"},
		{"trusted proxy without the header", "10.0.0.2:80", nil, "10.0.0.2"},
		{"garbage ends the walk at the proxy", "10.0.0.2:80", []string{"198.51.100.1, not-an-ip"}, "10.0.0.2"},
		{"entries with ports and brackets", "[fd00::1]:443", []string{"[2001:db8::1]:1234, 10.0.0.3:99"}, "2001:db8::1"},
		{"IPv4-mapped peer", "[::ffff:192.168.1.20]:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"empty entries skipped", "10.0.0.2:80", []string{"198.51.100.1, , "}, "198.51.100.1"},
		{"not an IP peer", "@", []string{"198.51.100.1"}, "@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := clientAddr(r, trusted); got != tc.want {
				t.Errorf("clientAddr = %q, want %q", got, tc.want)
			}
		})
	}
	// No trusted proxies: the header is never read.
	r := &http.Request{RemoteAddr: "10.0.0.2:80", Header: http.Header{"X-Forwarded-For": {"198.51.100.1"}}}
	if got := clientAddr(r, nil); got != "10.0.0.2" {
		t.Errorf("without trusted proxies: %q, want the peer", got)
	}
}

func TestForwardedHost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, host, proto string }{
		{`host=cp.example.com`, "cp.example.com", ""},
		{`for=192.0.2.60;proto=HTTPS;host="cp.example.com:8443", host=second`, "cp.example.com:8443", "https"},
		{`For="[2001:db8::1]:80"; Host=a.example ;proto=http`, "a.example", "http"},
		{`host="unterminated`, "", ""},
		{`host=a.example junk`, "", ""},
		{`for=1.2.3.4, host=second`, "", ""},
		{``, "", ""},
	} {
		if h, p := forwardedHost(tc.in); h != tc.host || p != tc.proto {
			t.Errorf("forwardedHost(%q) = %q, %q; want %q, %q", tc.in, h, p, tc.host, tc.proto)
		}
	}
}
