package workerapi

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// checkTrustedProxies checks Config.TrustedProxies and returns them
// masked, IPv4-mapped IPv6 prefixes as IPv4 ones (addresses are compared
// unmapped).
func checkTrustedProxies(ps []netip.Prefix) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ps))
	for i, p := range ps {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: TrustedProxies[%d] is not a valid prefix", ErrConfig, i)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// clientAddr is the client address of r for its log line (client_addr):
// the peer's IP (r.RemoteAddr), or, while the address reached is one of
// the trusted proxies, the X-Forwarded-For entry that proxy appended,
// walked from the right: the right-most address that is not a trusted
// proxy, or the left-most entry if every one is. An entry that is not an
// IP address ends the walk at the proxy that forwarded it. The result is
// logged, and keys per-client limits (Server.ClientAddr): an entry a
// client wrote itself is never reached while a trusted proxy appended
// the client's address after it.
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
	addr, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return r.RemoteAddr // not an IP peer (a test's pipe, a unix socket)
	}
	if !isTrusted(addr, trusted) {
		return addr.String()
	}
	xff := r.Header.Values("X-Forwarded-For")
	for i := len(xff) - 1; i >= 0; i-- {
		entries := strings.Split(xff[i], ",")
		for j := len(entries) - 1; j >= 0; j-- {
			e := strings.Trim(entries[j], " \t")
			if e == "" {
				continue
			}
			a, ok := parseAddr(e)
			if !ok {
				return addr.String()
			}
			addr = a
			if !isTrusted(addr, trusted) {
				return addr.String()
			}
		}
	}
	return addr.String()
}

// ClientAddr is the address of r's client as the request log's
// client_addr gives it: r's peer, or past the Config.TrustedProxies the
// address the last of them forwarded. A host keys its own per-client
// limits with it, as the example server's console does its sign-ins.
func (s *Server) ClientAddr(r *http.Request) string { return clientAddr(r, s.trusted) }

// parseAddr parses an IP address, with or without a port, IPv6 in
// brackets or not, and unmaps an IPv4-mapped one.
func parseAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	a = a.WithZone("")
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
