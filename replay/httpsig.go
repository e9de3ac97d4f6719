package replay

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/dunglas/httpsfv"
)

// Derived components of RFC 9421 §2.2 that SignatureBase resolves. Any
// other covered component must be a header field, named in lowercase.
const (
	ComponentMethod        = "@method"
	ComponentTargetURI     = "@target-uri"
	ComponentAuthority     = "@authority"
	ComponentScheme        = "@scheme"
	ComponentRequestTarget = "@request-target"
	ComponentPath          = "@path"
	ComponentQuery         = "@query"
)

// SignatureParams are the covered components and the parameters of one
// signature (RFC 9421 §2.3), each in its order: the order is part of what
// is signed.
type SignatureParams struct {
	// Components are component identifiers: derived components such as
	// "@method", or lowercase header field names. Component parameters
	// (";sf", ";key", ";req", ...) are not supported.
	Components []string
	// Params are the signature parameters, such as created, expires,
	// nonce, keyid, alg and tag.
	Params []Param
}

// Param is one signature parameter. Value is an int64 (created, expires)
// or a string (nonce, keyid, alg, tag).
type Param struct {
	Name  string
	Value any
}

// Get returns the value of the first parameter called name.
func (p *SignatureParams) Get(name string) (any, bool) {
	for _, x := range p.Params {
		if x.Name == name {
			return x.Value, true
		}
	}
	return nil, false
}

// Serialize returns p as an RFC 8941 inner list with parameters: the value
// of the "@signature-params" line of the signature base and of the
// signature's member of Signature-Input.
func (p *SignatureParams) Serialize() (string, error) {
	b, err := p.appendTo(nil)
	return string(b), err
}

func (p *SignatureParams) appendTo(b []byte) ([]byte, error) {
	b = append(b, '(')
	for i, c := range p.Components {
		if i > 0 {
			b = append(b, ' ')
		}
		var err error
		if b, err = appendString(b, c); err != nil {
			return nil, fmt.Errorf("component: %w", err)
		}
	}
	b = append(b, ')')
	for _, x := range p.Params {
		if !validKey(x.Name) {
			return nil, fmt.Errorf("parameter name %q is not a structured field key", x.Name)
		}
		b = append(b, ';')
		b = append(b, x.Name...)
		b = append(b, '=')
		switch v := x.Value.(type) {
		case int64:
			if v > maxInteger || v < -maxInteger {
				return nil, fmt.Errorf("parameter %s: %d is out of range", x.Name, v)
			}
			b = strconv.AppendInt(b, v, 10)
		case string:
			var err error
			if b, err = appendString(b, v); err != nil {
				return nil, fmt.Errorf("parameter %s: %w", x.Name, err)
			}
		default:
			return nil, fmt.Errorf("parameter %s: value of type %T is neither int64 nor string", x.Name, x.Value)
		}
	}
	return b, nil
}

// paramsFromInnerList converts a parsed Signature-Input member.
func paramsFromInnerList(il httpsfv.InnerList) (*SignatureParams, error) {
	p := &SignatureParams{Components: make([]string, 0, len(il.Items))}
	for _, it := range il.Items {
		c, ok := it.Value.(string)
		if !ok {
			return nil, fmt.Errorf("component identifier %v is not a string", it.Value)
		}
		if it.Params != nil && len(it.Params.Names()) > 0 {
			return nil, fmt.Errorf("component %q has parameters, which are not supported", c)
		}
		p.Components = append(p.Components, c)
	}
	if il.Params != nil {
		for _, name := range il.Params.Names() {
			v, _ := il.Params.Get(name)
			switch v.(type) {
			case int64, string:
			default:
				return nil, fmt.Errorf("parameter %s: value %v is neither an integer nor a string", name, v)
			}
			p.Params = append(p.Params, Param{Name: name, Value: v})
		}
	}
	return p, nil
}

// SignatureBase returns the signature base (RFC 9421 §2.5) of request r
// for p: one line per covered component, then "@signature-params", lines
// ending in LF but the last.
//
// A request received by a server (r.RequestURI set) gives its components
// as received: @path and @query come from the request-target exactly as
// sent, whatever a router or http.StripPrefix did to r.URL since; the
// scheme is https when r.TLS is set. A client request (r.RequestURI empty)
// gives them as it will be written: r.URL.RequestURI(), and r.Host or else
// r.URL.Host. @authority is lowercased and loses the default port of its
// scheme. A header field's value is its field lines, trimmed of
// surrounding spaces and tabs, joined with ", ".
//
// It fails if a component is absent, unknown, listed twice, or has a
// control character in its value.
func SignatureBase(r *http.Request, p *SignatureParams) ([]byte, error) {
	b, _, err := signatureBase(r, p)
	return b, err
}

// signatureBase also returns where the serialised parameters start in it.
func signatureBase(r *http.Request, p *SignatureParams) (b []byte, paramsAt int, err error) {
	b = make([]byte, 0, 512)
	for i, c := range p.Components {
		for _, o := range p.Components[:i] {
			if o == c {
				return nil, 0, fmt.Errorf("component %q is covered twice", c)
			}
		}
		v, err := componentValue(r, c)
		if err != nil {
			return nil, 0, err
		}
		for j := 0; j < len(v); j++ {
			if ch := v[j]; (ch < 0x20 && ch != '\t') || ch == 0x7f {
				return nil, 0, fmt.Errorf("component %q has a control character", c)
			}
		}
		if b, err = appendString(b, c); err != nil {
			return nil, 0, err
		}
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, '\n')
	}
	b = append(b, `"@signature-params": `...)
	paramsAt = len(b)
	b, err = p.appendTo(b)
	return b, paramsAt, err
}

// ComponentValue returns the value that SignatureBase gives the covered
// component c of request r (a derived component such as "@authority" or
// "@path", or a lowercase header field name), read as SignatureBase reads
// it: for a request received by a server, as received. A server that
// refuses a signature uses it to say which value it verified against.
func ComponentValue(r *http.Request, c string) (string, error) {
	return componentValue(r, c)
}

func componentValue(r *http.Request, c string) (string, error) {
	switch c {
	case ComponentMethod:
		if r.Method == "" {
			return http.MethodGet, nil // as net/http sends it
		}
		return r.Method, nil
	case ComponentAuthority:
		return authority(r), nil
	case ComponentScheme:
		return scheme(r), nil
	case ComponentTargetURI:
		path, query, hasQuery := splitTarget(requestTarget(r))
		u := scheme(r) + "://" + authority(r) + path
		if hasQuery {
			u += "?" + query
		}
		return u, nil
	case ComponentRequestTarget:
		return requestTarget(r), nil
	case ComponentPath:
		path, _, _ := splitTarget(requestTarget(r))
		return path, nil
	case ComponentQuery:
		// An absent query is the empty query (RFC 9421 §2.2.7).
		_, query, _ := splitTarget(requestTarget(r))
		return "?" + query, nil
	}
	if strings.HasPrefix(c, "@") {
		return "", fmt.Errorf("derived component %q is not supported", c)
	}
	if c == "" || strings.ToLower(c) != c {
		return "", fmt.Errorf("header component %q is not a lowercase field name", c)
	}
	lines := r.Header.Values(c)
	if len(lines) == 0 {
		return "", fmt.Errorf("covered header field %q is absent", c)
	}
	if len(lines) == 1 {
		return strings.Trim(lines[0], " \t"), nil
	}
	trimmed := make([]string, len(lines))
	for i, l := range lines {
		trimmed[i] = strings.Trim(l, " \t")
	}
	return strings.Join(trimmed, ", "), nil
}

// requestTarget is the request-target of the request line.
func requestTarget(r *http.Request) string {
	if r.RequestURI != "" {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// splitTarget splits a request-target into its path (the origin-form path,
// "/" when empty) and its query.
func splitTarget(t string) (path, query string, hasQuery bool) {
	if !strings.HasPrefix(t, "/") {
		// absolute-form: scheme://authority[/path][?query]
		if i := strings.Index(t, "://"); i >= 0 {
			rest := t[i+3:]
			j := strings.IndexAny(rest, "/?")
			if j < 0 {
				return "/", "", false
			}
			t = rest[j:]
		}
	}
	path, query, hasQuery = strings.Cut(t, "?")
	if path == "" {
		path = "/"
	}
	return path, query, hasQuery
}

func scheme(r *http.Request) string {
	if r.RequestURI == "" {
		if r.URL.Scheme != "" {
			return strings.ToLower(r.URL.Scheme)
		}
		return "http"
	}
	if r.TLS != nil {
		return "https"
	}
	if r.URL.Scheme != "" { // absolute-form request-target
		return strings.ToLower(r.URL.Scheme)
	}
	return "http"
}

func authority(r *http.Request) string {
	h := r.Host
	if h == "" && r.URL != nil {
		h = r.URL.Host
	}
	h = strings.ToLower(h)
	switch scheme(r) {
	case "http":
		h = strings.TrimSuffix(h, ":80")
	case "https":
		h = strings.TrimSuffix(h, ":443")
	}
	return h
}

// Signature is one signature of a request, as read from its
// Signature-Input and Signature fields.
type Signature struct {
	Label  string
	Params *SignatureParams
	// Value is the signature itself.
	Value []byte
}

// ParseSignature reads the signature labelled label from the
// Signature-Input and Signature fields of h. Other labels are parsed but
// ignored.
//
// It returns ErrMissingSignature if either field is absent, and
// ErrMalformedSignature if a field does not parse, names a member or a
// parameter twice (across field lines too), lacks the label, or if the
// label's members are not an inner list of strings with integer or string
// parameters and a byte sequence without parameters.
func ParseSignature(h http.Header, label string) (*Signature, error) {
	inLines, sigLines := h.Values("Signature-Input"), h.Values("Signature")
	if len(inLines) == 0 {
		return nil, fmt.Errorf("%w: no Signature-Input", ErrMissingSignature)
	}
	if len(sigLines) == 0 {
		return nil, fmt.Errorf("%w: no Signature", ErrMissingSignature)
	}
	in, err := parseDictionary(inLines)
	if err != nil {
		return nil, fmt.Errorf("%w: Signature-Input: %v", ErrMalformedSignature, err)
	}
	sigs, err := parseDictionary(sigLines)
	if err != nil {
		return nil, fmt.Errorf("%w: Signature: %v", ErrMalformedSignature, err)
	}
	m, ok := in.Get(label)
	if !ok {
		return nil, fmt.Errorf("%w: Signature-Input has no signature labelled %q", ErrMalformedSignature, label)
	}
	il, ok := m.(httpsfv.InnerList)
	if !ok {
		return nil, fmt.Errorf("%w: Signature-Input member %q is not an inner list", ErrMalformedSignature, label)
	}
	p, err := paramsFromInnerList(il)
	if err != nil {
		return nil, fmt.Errorf("%w: Signature-Input: %v", ErrMalformedSignature, err)
	}
	m, ok = sigs.Get(label)
	if !ok {
		return nil, fmt.Errorf("%w: Signature has no signature labelled %q", ErrMalformedSignature, label)
	}
	it, ok := m.(httpsfv.Item)
	if !ok {
		return nil, fmt.Errorf("%w: Signature member %q is not an item", ErrMalformedSignature, label)
	}
	v, ok := it.Value.([]byte)
	if !ok || (it.Params != nil && len(it.Params.Names()) > 0) {
		return nil, fmt.Errorf("%w: Signature member %q is not a byte sequence without parameters", ErrMalformedSignature, label)
	}
	return &Signature{Label: label, Params: p, Value: v}, nil
}

// SignRequest signs r with key for p, and sets its Signature-Input and
// Signature fields to that one signature, labelled label, replacing any
// they held. Every covered header field must already be set.
func SignRequest(r *http.Request, label string, p *SignatureParams, key ed25519.PrivateKey) error {
	if !validKey(label) {
		return fmt.Errorf("replay: label %q is not a structured field key", label)
	}
	if len(key) != ed25519.PrivateKeySize {
		return fmt.Errorf("replay: Ed25519 private key has %d bytes, not %d", len(key), ed25519.PrivateKeySize)
	}
	base, paramsAt, err := signatureBase(r, p)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	sig := ed25519.Sign(key, base)
	params := base[paramsAt:]
	if r.Header == nil {
		r.Header = make(http.Header)
	}
	r.Header.Set("Signature-Input", label+"="+string(params))
	r.Header.Set("Signature", label+"=:"+base64.StdEncoding.EncodeToString(sig)+":")
	return nil
}

// VerifyRequest checks sig, read from r, with the Ed25519 key pub. It
// returns ErrMalformedSignature if the signature base cannot be built
// (a covered component is absent or unsupported) and ErrBadSignature if
// the signature does not verify or names an alg other than ed25519. It
// checks neither created nor expires: the profile does.
func VerifyRequest(r *http.Request, sig *Signature, pub ed25519.PublicKey) error {
	if alg, ok := sig.Params.Get("alg"); ok && alg != "ed25519" {
		return fmt.Errorf("%w: alg %v is not ed25519", ErrBadSignature, alg)
	}
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: Ed25519 public key has %d bytes, not %d", ErrBadSignature, len(pub), ed25519.PublicKeySize)
	}
	base, err := SignatureBase(r, sig.Params)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedSignature, err)
	}
	if !ed25519.Verify(pub, base, sig.Value) {
		return fmt.Errorf("%w: signature %q does not verify", ErrBadSignature, sig.Label)
	}
	return nil
}
