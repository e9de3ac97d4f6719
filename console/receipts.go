package console

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
)

type receiptsData struct {
	Checkpoint    *receipts.Checkpoint
	Note          string
	CheckpointErr string
	Receipts      []receiptRow
	NextQuery     string
	// Export is the outcome of verifying an export, when one was sent.
	Export *exportResult
}

func (c *Console) receiptsPage(w http.ResponseWriter, r *http.Request, s *session) {
	c.renderReceipts(w, r, s, nil)
}

func (c *Console) renderReceipts(w http.ResponseWriter, r *http.Request, s *session, export *exportResult) {
	ctx := r.Context()
	d := receiptsData{Export: export}
	fail := func(err error) {
		c.render(w, r, status(err), "receipts", s, &pageData{Title: "Receipts", Data: d, Flashes: []flash{{Error: true, Text: explain(err)}}})
	}
	api := c.op(s.token)
	note, err := api.Checkpoint(ctx)
	if err != nil {
		fail(err)
		return
	}
	d.Note = string(note)
	cp, err := receipts.OpenCheckpoint(note, c.cfg.VerifierKey, c.cfg.Origin)
	if err != nil {
		d.CheckpointErr = "The checkpoint does not verify with the configured key: " + err.Error()
	} else {
		d.Checkpoint = cp
	}
	q := operator.ReceiptQuery{Limit: PageSize}
	if a := r.URL.Query().Get("after"); a != "" {
		after, err := strconv.ParseInt(a, 10, 64)
		if err != nil || after < 0 {
			fail(&requestError{fmt.Sprintf("the receipt index %q is not a whole number", a)})
			return
		}
		q.From = after + 1
	} else if cp != nil && cp.Size > PageSize {
		// The latest page by default.
		q.From = cp.Size - PageSize
	}
	page, err := api.ListReceipts(ctx, q)
	if err != nil {
		fail(err)
		return
	}
	for _, wr := range page.Receipts {
		row := receiptRow{ID: wr.ID, Kind: wr.Kind, Index: wr.Index}
		row.Receipt, _ = receipts.Decode(wr.Body)
		d.Receipts = append(d.Receipts, row)
	}
	if page.Next != nil {
		d.NextQuery = url.Values{"after": {strconv.FormatInt(*page.Next, 10)}}.Encode()
	}
	c.render(w, r, http.StatusOK, "receipts", s, &pageData{Title: "Receipts", Data: d})
}

type receiptData struct {
	Row receiptRow
}

func (c *Console) receipt(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	id := r.PathValue("id")
	cp, err := c.checkpoint(ctx, s.token)
	if err != nil {
		c.render(w, r, status(err), "receipt", s, &pageData{Title: "Receipt " + id, Nav: "receipts", Flashes: []flash{{Error: true, Text: explain(err)}}})
		return
	}
	row := c.verifyReceipt(ctx, s.token, id, cp)
	code := http.StatusOK
	if row.Kind == "" {
		code = http.StatusNotFound
	}
	c.render(w, r, code, "receipt", s, &pageData{Title: "Receipt " + id, Nav: "receipts", Data: receiptData{Row: row}})
}

// Limits of an export the console verifies.
const (
	// MaxExportBytes bounds the export file (and the checkpoint) sent to
	// POST /receipts/verify.
	MaxExportBytes = 32 << 20
	// maxExportLine bounds one line, as verify-receipts does.
	maxExportLine = 1 << 20
)

// exportResult is the outcome of verifying an export.
type exportResult struct {
	OK         bool
	Checkpoint *receipts.Checkpoint
	Receipts   int64
	Proofs     int64
	Message    string
}

// verifyExport checks an export of the log (receipts.Log.Export's lines
// and signed checkpoint, as cmd/verify-receipts reads them) with the
// configured verifier key: the checkpoint's signature, each receipt's
// canonical form and index, each inclusion proof the export carries, and
// that the receipts hash to the checkpoint's root.
func (c *Console) verifyExport(w http.ResponseWriter, r *http.Request, s *session) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxExportBytes+maxForm)
	if err := r.ParseMultipartForm(1 << 20); err != nil {
		c.renderReceipts(w, r, s, &exportResult{Message: "The export could not be read: " + err.Error()})
		return
	}
	defer r.MultipartForm.RemoveAll()
	read := func(name string) ([]byte, error) {
		f, _, err := r.FormFile(name)
		if err != nil {
			if v := r.FormValue(name); v != "" {
				return []byte(v), nil
			}
			return nil, fmt.Errorf("no %s was sent", name)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, MaxExportBytes+1))
		if err == nil && len(b) > MaxExportBytes {
			err = fmt.Errorf("the %s is larger than %d MiB", name, MaxExportBytes>>20)
		}
		return b, err
	}
	note, err := read("checkpoint")
	if err != nil {
		c.renderReceipts(w, r, s, &exportResult{Message: "The export could not be read: " + err.Error()})
		return
	}
	export, err := read("export")
	if err != nil {
		c.renderReceipts(w, r, s, &exportResult{Message: "The export could not be read: " + err.Error()})
		return
	}
	c.renderReceipts(w, r, s, c.checkExport(note, export))
}

func (c *Console) checkExport(note, export []byte) *exportResult {
	res := &exportResult{}
	cp, err := receipts.OpenCheckpoint(note, c.cfg.VerifierKey, c.cfg.Origin)
	if err != nil {
		res.Message = "The checkpoint does not verify: " + err.Error()
		return res
	}
	res.Checkpoint = cp
	var (
		leaves int64
		hashes memHashes // the stored hashes of the tree recomputed here
	)
	sc := bufio.NewScanner(bytes.NewReader(export))
	sc.Buffer(make([]byte, 64<<10), maxExportLine)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l receipts.ExportLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			res.Message = fmt.Sprintf("line %d: not an export line: %v", line, err)
			return res
		}
		n := leaves
		if l.Index == nil || *l.Index != n {
			res.Message = fmt.Sprintf("line %d: receipt %s does not have index %d, the log's next", line, l.ID, n)
			return res
		}
		rc, err := receipts.Decode(l.Body)
		if err != nil {
			res.Message = fmt.Sprintf("line %d: receipt %s: %v", line, l.ID, err)
			return res
		}
		if rc.ID != l.ID || rc.Kind != l.Kind {
			res.Message = fmt.Sprintf("line %d: the body is receipt %s (%s), the line says %s (%s)", line, rc.ID, rc.Kind, l.ID, l.Kind)
			return res
		}
		if l.Proof != nil {
			if err := receipts.CheckInclusion(cp, l.Body, *l.Proof); err != nil {
				res.Message = fmt.Sprintf("line %d: receipt %s: %v", line, l.ID, err)
				return res
			}
			res.Proofs++
		}
		hs, err := tlog.StoredHashesForRecordHash(n, tlog.RecordHash(l.Body), hashes)
		if err != nil {
			res.Message = fmt.Sprintf("line %d: %v", line, err)
			return res
		}
		hashes = append(hashes, hs...)
		leaves++
		if leaves > cp.Size {
			res.Message = fmt.Sprintf("line %d: the export has more receipts than the checkpoint's %d", line, cp.Size)
			return res
		}
	}
	if err := sc.Err(); err != nil {
		res.Message = "The export could not be read: " + err.Error()
		return res
	}
	res.Receipts = leaves
	if res.Receipts != cp.Size {
		res.Message = fmt.Sprintf("The export has %d receipts; the checkpoint's tree has %d.", res.Receipts, cp.Size)
		return res
	}
	if root, err := tlog.TreeHash(res.Receipts, hashes); err != nil || root != cp.Root {
		res.Message = "The receipts do not hash to the checkpoint's root."
		return res
	}
	res.OK = true
	res.Message = fmt.Sprintf("Verified: %d receipts (%d with inclusion proofs) of %s hash to the signed checkpoint's root %s.", res.Receipts, res.Proofs, cp.Origin, cp.Root)
	return res
}

// memHashes is a tlog.HashReader over the stored hashes of a tree built
// in memory.
type memHashes []tlog.Hash

func (m memHashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		if x < 0 || x >= int64(len(m)) {
			return nil, fmt.Errorf("hash %d is not in the tree", x)
		}
		out[i] = m[x]
	}
	return out, nil
}
