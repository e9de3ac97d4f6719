package apitest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// keyName names the receipt log's key and is the checkpoints' origin.
const keyName = "apitest.local/receipts"

func receiptsKey() (signer, verifier string, err error) {
	return receipts.GenerateKey(rand.Reader, keyName)
}

// Node is a worker node: an Ed25519 key that signs its requests and,
// once registered, a worker token.
type Node struct {
	env *Env
	// NodeID is the node_id it registers under.
	NodeID string
	// Key is its private key; PublicKey the public key as public_key
	// carries it (unpadded base64url).
	Key       ed25519.PrivateKey
	PublicKey string
	// Token is the bearer token Do sends: the worker token once Register
	// succeeded. Tests may change it.
	Token string
	// WorkerID is set by Register.
	WorkerID string
	// Now is the signer's clock. Defaults to real time, so that moving
	// Env.Clock makes signatures stale.
	Now func() time.Time
}

// NewNode returns a node with a fresh key, not registered.
func (e *Env) NewNode(t testing.TB, nodeID string) *Node {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &Node{env: e, NodeID: nodeID, Key: key, PublicKey: base64.RawURLEncoding.EncodeToString(pub), Now: time.Now}
}

// Env returns the Env the node talks to.
func (n *Node) Env() *Env { return n.env }

// On returns a copy of the node that talks to another replica.
func (n *Node) On(e *Env) *Node {
	c := *n
	c.env = e
	return &c
}

// Register registers the node with the provisioning token, filling
// NodeID and PublicKey into req when they are empty, and fails the test
// unless the answer is 201 or 200. It keeps the worker token and id.
func (n *Node) Register(t testing.TB, req wire.RegisterRequest) wire.RegisterResponse {
	t.Helper()
	if req.NodeID == "" {
		req.NodeID = n.NodeID
	}
	if req.PublicKey == "" {
		req.PublicKey = n.PublicKey
	}
	r := n.Request(t, http.MethodPost, "/workers/register", req)
	r.Header.Set("Authorization", "Bearer "+n.env.ProvisioningToken)
	resp, body := n.env.Raw(t, r)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("apitest: register %s: %d %s", n.NodeID, resp.StatusCode, body)
	}
	var out wire.RegisterResponse
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("apitest: register %s: %v in %s", n.NodeID, err, body)
	}
	n.Token, n.WorkerID = out.WorkerToken, out.WorkerID
	return out
}

// Do sends a signed request with the node's token (see Env.Operator for
// how body is encoded) and returns the response and its body.
func (n *Node) Do(t testing.TB, method, path string, body any) (*http.Response, []byte) {
	t.Helper()
	return n.env.Raw(t, n.Request(t, method, path, body))
}

// Request builds the request Do sends, with Content-Type
// application/json, the node's bearer token and a fresh signature, for a
// test to change (headers not covered by the signature, such as
// Authorization, stay valid) and send with Raw, once or several times.
func (n *Node) Request(t testing.TB, method, path string, body any) *http.Request {
	t.Helper()
	b := Body(t, body)
	req, err := http.NewRequest(method, n.env.URL+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if n.Token != "" {
		req.Header.Set("Authorization", "Bearer "+n.Token)
	}
	n.Sign(t, req, b)
	return req
}

// Sign signs req, whose body is body, with the node's key and a fresh
// nonce, replacing any signature it had. Content-Type must be set.
func (n *Node) Sign(t testing.TB, req *http.Request, body []byte) {
	t.Helper()
	req.Header.Del("Signature")
	req.Header.Del("Signature-Input")
	s := replay.NewSigner(n.Key, &replay.SignerConfig{Now: n.Now})
	if err := s.Sign(req, body); err != nil {
		t.Fatalf("apitest: sign: %v", err)
	}
}

// Raw sends req as it is (see Env.Raw).
func (n *Node) Raw(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	return n.env.Raw(t, req)
}

// Post sends a signed POST of body from n to path, fails the test unless
// the answer has status want, and decodes it into a T.
func Post[T any](t testing.TB, n *Node, path string, body any, want int) T {
	t.Helper()
	resp, b := n.Do(t, http.MethodPost, path, body)
	if resp.StatusCode != want {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v in %s", path, err, b)
	}
	return v
}

// Upload stores content as an artifact of job jobID, leased with tok,
// through the control plane as a worker does: the upload, each part as a
// signed PUT, then the finish. It fails the test unless every step
// succeeds and the parts went to the control plane, not to a presigned
// URL, and returns the finish's answer.
func (n *Node) Upload(t testing.TB, jobID, tok, artifactType, name string, content []byte) wire.ArtifactResponse {
	t.Helper()
	h := sha256.Sum256(content)
	sum, size := hex.EncodeToString(h[:]), int64(len(content))
	up := Post[wire.UploadResponse](t, n, wire.JobPath(jobID, wire.ActionUploads), wire.UploadRequest{
		LeaseToken: tok, ArtifactType: artifactType, Name: name, SizeBytes: &size, ChecksumSHA256: sum,
	}, http.StatusCreated)
	if up.Direct {
		t.Fatalf("apitest: upload = %+v, want parts to the control plane", up)
	}
	for _, p := range up.Parts {
		body := content[p.Offset : p.Offset+p.SizeBytes]
		req, err := http.NewRequest(http.MethodPut, n.env.URL+p.URL, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Authorization", "Bearer "+n.Token)
		req.Header.Set(wire.HeaderLeaseToken, tok)
		n.Sign(t, req, body)
		if resp, b := n.Raw(t, req); resp.StatusCode != http.StatusOK {
			t.Fatalf("apitest: part %d: %d %s", p.PartNumber, resp.StatusCode, b)
		}
	}
	art := Post[wire.ArtifactResponse](t, n, wire.JobPath(jobID, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: artifactType, Name: name, UploadID: up.UploadID, ChecksumSHA256: &sum, SizeBytes: &size,
	}, http.StatusCreated)
	if !art.Stored {
		t.Fatalf("apitest: finish = %+v, want stored", art)
	}
	return art
}
