package operator

import (
	"context"
	"fmt"
	"iter"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// pages yields the items of the pages fetch reads, from the cursor start
// on: fetch reads the page after a cursor and returns its items and the
// next cursor (nil after the last page). A read that fails is yielded
// once, as the last value. A next cursor equal to the one read is a
// malformed answer (following it would never end). The caller may stop
// at any item; no page is read ahead.
func pages[T any, K comparable](route string, start K, fetch func(after K) ([]T, *K, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		after := start
		for {
			items, next, err := fetch(after)
			if err != nil {
				yield(zero, err)
				return
			}
			for _, it := range items {
				if !yield(it, nil) {
					return
				}
			}
			if next == nil {
				return
			}
			if *next == after {
				yield(zero, fmt.Errorf("operator: %s: %w: its next cursor %v is the one it was asked for", route, ErrMalformedAnswer, after))
				return
			}
			after = *next
		}
	}
}

// Jobs yields the jobs q selects, in id order, from q.After on, reading
// page after page (q.Limit a page) until the last or until the caller
// stops. An error ends the sequence: it is yielded once, with a zero job.
//
//	for j, err := range api.Jobs(ctx, operator.JobQuery{State: "queued"}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(j.ID, j.JobType)
//	}
func (c *Client) Jobs(ctx context.Context, q JobQuery) iter.Seq2[wire.OperatorJob, error] {
	return pages("GET /operator/jobs", q.After, func(after string) ([]wire.OperatorJob, *string, error) {
		q.After = after
		p, err := c.ListJobs(ctx, q)
		if err != nil {
			return nil, nil, err
		}
		return p.Jobs, p.Next, nil
	})
}

// JobEvents yields a job's status events and log lines with ids above
// after (0: all), in order, reading GET /operator/jobs/{id} page after
// page. An error ends the sequence, yielded once.
func (c *Client) JobEvents(ctx context.Context, id string, after int64) iter.Seq2[wire.JobEventView, error] {
	return pages("GET "+jobPath(id), after, func(after int64) ([]wire.JobEventView, *int64, error) {
		d, err := c.Job(ctx, id, after)
		if err != nil {
			return nil, nil, err
		}
		return d.Events, d.EventsNext, nil
	})
}

// Artifacts yields the artifacts q selects, in id order, from q.After on
// (with q.JobID, all of one job's, where its view shows the first
// wire.MaxJobArtifacts). An error ends the sequence, yielded once.
func (c *Client) Artifacts(ctx context.Context, q ArtifactQuery) iter.Seq2[wire.ArtifactView, error] {
	return pages("GET /operator/artifacts", q.After, func(after string) ([]wire.ArtifactView, *string, error) {
		q.After = after
		p, err := c.ListArtifacts(ctx, q)
		if err != nil {
			return nil, nil, err
		}
		return p.Artifacts, p.Next, nil
	})
}

// Workers yields the registered workers in id order, from q.After on. An
// error ends the sequence, yielded once.
func (c *Client) Workers(ctx context.Context, q WorkerQuery) iter.Seq2[wire.WorkerView, error] {
	return pages("GET /operator/workers", q.After, func(after string) ([]wire.WorkerView, *string, error) {
		q.After = after
		p, err := c.ListWorkers(ctx, q)
		if err != nil {
			return nil, nil, err
		}
		return p.Workers, p.Next, nil
	})
}

// Credentials yields the credentials q selects, in byte order of their
// ids, from q.After on. An error ends the sequence, yielded once.
func (c *Client) Credentials(ctx context.Context, q CredentialQuery) iter.Seq2[wire.CredentialView, error] {
	return pages("GET /operator/credentials", q.After, func(after string) ([]wire.CredentialView, *string, error) {
		q.After = after
		p, err := c.ListCredentials(ctx, q)
		if err != nil {
			return nil, nil, err
		}
		return p.Credentials, p.Next, nil
	})
}

// Receipts yields the sequenced receipts q selects, in index order, from
// index q.From on, until the end of the log as it is when each page is
// read (with Order desc, newest first down to index 0). An error ends the
// sequence, yielded once.
func (c *Client) Receipts(ctx context.Context, q ReceiptQuery) iter.Seq2[receipts.WireReceipt, error] {
	return pages("GET /operator/receipts", q.cursor(), func(after int64) ([]receipts.WireReceipt, *int64, error) {
		p, err := c.listReceipts(ctx, q, after)
		if err != nil {
			return nil, nil, err
		}
		return p.Receipts, p.Next, nil
	})
}
