package console

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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
	// NextQuery is the query of the next, older page; Newest is set on a
	// page that is not the newest.
	NextQuery string
	Newest    bool
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
	// Newest first: a page is the PageSize receipts before the index
	// ?before= (default: the checkpoint's size), shown in reverse; ?after=
	// (older links) still names the index a page starts past.
	in := r.URL.Query()
	var size int64
	if cp != nil {
		size = cp.Size
	}
	from, to := max(size-PageSize, 0), size
	if cp == nil {
		// Unverified: the first page, as the API lists it.
		from, to = 0, PageSize
	}
	switch a, bf := in.Get("after"), in.Get("before"); {
	case a != "":
		after, err := strconv.ParseInt(a, 10, 64)
		if err != nil || after < 0 {
			fail(&requestError{fmt.Sprintf("the receipt index %q is not a whole number", a)})
			return
		}
		from, to = after+1, after+1+PageSize
	case bf != "":
		before, err := strconv.ParseInt(bf, 10, 64)
		if err != nil || before < 0 {
			fail(&requestError{fmt.Sprintf("the receipt index %q is not a whole number", bf)})
			return
		}
		from, to = max(before-PageSize, 0), before
	}
	var page []receipts.WireReceipt
	if to > from {
		out, err := api.ListReceipts(ctx, operator.ReceiptQuery{From: from, Limit: int(to - from)})
		if err != nil {
			fail(err)
			return
		}
		page = out.Receipts
	}
	for i := len(page) - 1; i >= 0; i-- {
		wr := page[i]
		if wr.Index == nil || *wr.Index >= to {
			continue
		}
		row := receiptRow{ID: wr.ID, Kind: wr.Kind, Index: wr.Index}
		row.Receipt, _ = receipts.Decode(wr.Body)
		d.Receipts = append(d.Receipts, row)
	}
	if from > 0 {
		d.NextQuery = url.Values{"before": {strconv.FormatInt(from, 10)}}.Encode()
	}
	d.Newest = to < size
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

// Limits of an export the console verifies; its whole size is
// Config.MaxExportBytes.
const (
	// maxCheckpoint bounds the signed checkpoint sent with an export.
	maxCheckpoint = 64 << 10
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
//
// The form is read as it arrives, part by part, the checkpoint first (the
// page's form sends it first): the export is checked line by line and
// the tree's hashes kept as its O(log n) complete subtrees, so memory is
// bounded by a line (maxExportLine), whatever the export's size, which
// Config.MaxExportBytes bounds.
func (c *Console) verifyExport(w http.ResponseWriter, r *http.Request, s *session) {
	r.Body = http.MaxBytesReader(w, r.Body, c.cfg.MaxExportBytes)
	c.renderReceipts(w, r, s, c.readExport(r))
}

func (c *Console) readExport(r *http.Request) *exportResult {
	fail := func(err error) *exportResult {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			err = fmt.Errorf("the form is larger than %d bytes", mb.Limit)
		}
		return &exportResult{Message: "The export could not be read: " + err.Error()}
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return fail(err)
	}
	var note []byte
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			if note == nil {
				return fail(errors.New("no checkpoint was sent"))
			}
			return fail(errors.New("no export was sent"))
		}
		if err != nil {
			return fail(err)
		}
		switch p.FormName() {
		case "checkpoint":
			b, err := io.ReadAll(io.LimitReader(p, maxCheckpoint+1))
			if err != nil {
				return fail(err)
			}
			if len(b) > maxCheckpoint {
				return fail(fmt.Errorf("the checkpoint is larger than %d KiB", maxCheckpoint>>10))
			}
			note = b
		case "export":
			if note == nil {
				return fail(errors.New("the export came before the checkpoint: send the checkpoint first"))
			}
			return c.checkExport(note, p)
		}
	}
}

// checkExport verifies the export read from export against the checkpoint
// note.
func (c *Console) checkExport(note []byte, export io.Reader) *exportResult {
	res := &exportResult{}
	cp, err := receipts.OpenCheckpoint(note, c.cfg.VerifierKey, c.cfg.Origin)
	if err != nil {
		res.Message = "The checkpoint does not verify: " + err.Error()
		return res
	}
	res.Checkpoint = cp
	var tree frontier
	sc := bufio.NewScanner(export)
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
		n := tree.n
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
		tree.append(tlog.RecordHash(l.Body))
		if tree.n > cp.Size {
			res.Message = fmt.Sprintf("line %d: the export has more receipts than the checkpoint's %d", line, cp.Size)
			return res
		}
	}
	if err := sc.Err(); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			err = fmt.Errorf("the form is larger than %d bytes", mb.Limit)
		}
		res.Message = "The export could not be read: " + err.Error()
		return res
	}
	res.Receipts = tree.n
	if res.Receipts != cp.Size {
		res.Message = fmt.Sprintf("The export has %d receipts; the checkpoint's tree has %d.", res.Receipts, cp.Size)
		return res
	}
	if tree.root() != cp.Root {
		res.Message = "The receipts do not hash to the checkpoint's root."
		return res
	}
	res.OK = true
	res.Message = fmt.Sprintf("Verified: %d receipts (%d with inclusion proofs) of %s hash to the signed checkpoint's root %s.", res.Receipts, res.Proofs, cp.Origin, cp.Root)
	return res
}

// frontier is a tlog tree (RFC 6962's) being built from its leaves in
// order, kept as the hashes of its complete subtrees, largest first: at
// most one per bit of n, so O(log n) memory.
type frontier struct {
	n      int64
	hashes []tlog.Hash
}

// append adds the leaf of hash h.
func (f *frontier) append(h tlog.Hash) {
	f.hashes = append(f.hashes, h)
	for m := f.n; m&1 == 1; m >>= 1 {
		k := len(f.hashes)
		f.hashes = append(f.hashes[:k-2], tlog.NodeHash(f.hashes[k-2], f.hashes[k-1]))
	}
	f.n++
}

// root is the tree's hash, as tlog.TreeHash computes it.
func (f *frontier) root() tlog.Hash {
	if len(f.hashes) == 0 {
		h, _ := tlog.TreeHash(0, nil) // the empty tree's, which reads nothing
		return h
	}
	h := f.hashes[len(f.hashes)-1]
	for i := len(f.hashes) - 2; i >= 0; i-- {
		h = tlog.NodeHash(f.hashes[i], h)
	}
	return h
}
