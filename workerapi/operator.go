package workerapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// The operator routes of PROTOCOL.md. They carry a bearer credential only
// and run without a transaction of the pipeline's: each handler that
// changes state makes its change, its receipt and its wake-up in one
// InTx of its own, and queues its hook events with c.after.

// rawText is an answer written as text/plain rather than JSON.
type rawText []byte

func (s *Server) writeText(w http.ResponseWriter, code int, b rawText) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if _, err := w.Write(b); err != nil {
		s.log.Warn("writing a response", "err", err)
	}
}

// maxPage is the largest page a list route answers.
const maxPage = 1000

// Request helpers.

// decodeOptional is decode for bodies that may be empty.
func (c *call) decodeOptional(v any) error {
	if strings.TrimSpace(string(c.body)) == "" {
		return nil
	}
	return c.decode(v)
}

// qString returns a query parameter given at most once; "" when absent.
func qString(q url.Values, name string) (string, error) {
	switch vs := q[name]; len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	default:
		return "", fmt.Errorf("%w: query parameter %s is given %d times", ErrInvalidRequest, name, len(vs))
	}
}

// qInt returns an integer query parameter in [lo, hi], and whether it was
// given.
func qInt(q url.Values, name string, lo, hi int64) (int64, bool, error) {
	if _, ok := q[name]; !ok {
		return 0, false, nil
	}
	s, err := qString(q, name)
	if err != nil {
		return 0, false, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, false, fmt.Errorf("%w: %s must be an integer from %d to %d", ErrInvalidRequest, name, lo, hi)
	}
	return n, true, nil
}

// qDesc returns whether ?order= asks for a descending page: "desc" does,
// "asc" or absence does not, any other value is an error.
func qDesc(q url.Values) (bool, error) {
	o, err := qString(q, "order")
	if err != nil {
		return false, err
	}
	switch o {
	case "", wire.OrderAsc:
		return false, nil
	case wire.OrderDesc:
		return true, nil
	}
	return false, fmt.Errorf("%w: order must be %s or %s", ErrInvalidRequest, wire.OrderAsc, wire.OrderDesc)
}

// qLimit returns ?limit= (1 to 1000), or 0 when absent.
func qLimit(q url.Values) (int, error) {
	n, _, err := qInt(q, "limit", 1, maxPage)
	return int(n), err
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func orNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func orEmptyObject(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
