package console

import (
	"context"
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Charts of the overview: their spans and buckets, which bound what they
// cost (ChartHours buckets from the jobs the overview lists anyway, and
// ChartDays calls of GET /operator/costs).
const (
	// ChartHours is the span of the queue-depth and throughput charts,
	// in hourly buckets.
	ChartHours = 24
	// ChartDays is the span of the spend chart, in daily buckets.
	ChartDays = 14
)

// series is one stack of a bar chart: a value per bucket, drawn with a
// CSS class.
type series struct {
	Name   string
	Class  string
	Values []float64
}

// chart is a bar chart the server draws as SVG.
type chart struct {
	ID, Caption string
	// Labels name the buckets; Unit follows a value in its tooltip.
	Labels []string
	Unit   string
	Series []series
	// Digits are the decimals a value is written with.
	Digits int
}

// Width and height of a chart's viewBox, and its plot area's margins.
const (
	chartW, chartH         = 320, 150
	padL, padR, padT, padB = 44, 6, 10, 22
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	// chartLabelEvery is how often a bucket is labelled on the x axis.
	chartLabelEvery = 6
)

// SVG draws c as an inline SVG element: stacked bars, a tooltip (<title>)
// on each, the largest total on the y axis, every sixth label and the
// last on the x axis. Every text it writes is escaped.
func (c chart) SVG() template.HTML {
	n := len(c.Labels)
	totals := make([]float64, n)
	for _, s := range c.Series {
		for i, v := range s.Values {
			if i < n {
				totals[i] += v
			}
		}
	}
	top := 0.0
	for _, t := range totals {
		top = max(top, t)
	}
	esc := template.HTMLEscapeString
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="%s" class="chart-svg" viewBox="0 0 %d %d" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		esc(c.ID), chartW, chartH, esc(c.Caption))
	fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, padL, padT+plotH, padL+plotW, padT+plotH)
	fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, padL, padT, padL, padT+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, padL-3, padT+8, esc(strconv.FormatFloat(top, 'f', c.Digits, 64)))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">0</text>`, padL-3, padT+plotH)
	if n > 0 {
		slot := float64(plotW) / float64(n)
		bw := max(slot-1, 1)
		for i := range n {
			x := float64(padL) + float64(i)*slot + (slot-bw)/2
			base := float64(padT + plotH)
			for _, s := range c.Series {
				if i >= len(s.Values) || s.Values[i] <= 0 || top == 0 {
					continue
				}
				h := s.Values[i] / top * float64(plotH)
				base -= h
				fmt.Fprintf(&b, `<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %s %s %s</title></rect>`,
					esc(s.Class), x, base, bw, h, esc(c.Labels[i]), esc(strconv.FormatFloat(s.Values[i], 'f', c.Digits, 64)), esc(c.Unit), esc(s.Name))
			}
			// Every sixth bucket is labelled, but for one near the last,
			// which is labelled ending at the plot's edge.
			switch {
			case i == n-1:
				fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, padL+plotW, padT+plotH+14, esc(c.Labels[i]))
			case i%chartLabelEvery == 0 && n-1-i >= chartLabelEvery/2:
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x+bw/2, padT+plotH+14, esc(c.Labels[i]))
			}
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// jobTimes is what the queue and throughput charts need of a job.
type jobTimes struct {
	state            string
	created          time.Time
	leased, finished *time.Time
}

// hourCharts draws the queue depth at the end of each of the last
// ChartHours hours and the jobs that ended in each, by outcome, from the
// jobs the overview listed. A requeued job counts as queued until its
// last lease; a job listed past the overview's bounds is not counted.
func hourCharts(now time.Time, jobs []jobTimes) (queue, throughput chart) {
	end := now.UTC().Truncate(time.Hour).Add(time.Hour)
	start := end.Add(-ChartHours * time.Hour)
	labels := make([]string, ChartHours)
	depth := make([]float64, ChartHours)
	ok, bad := make([]float64, ChartHours), make([]float64, ChartHours)
	for i := range ChartHours {
		labels[i] = start.Add(time.Duration(i) * time.Hour).Format("15:04")
	}
	for _, j := range jobs {
		left := j.leased
		if left == nil {
			left = j.finished
		}
		for i := range ChartHours {
			t := start.Add(time.Duration(i+1) * time.Hour)
			if t.After(now) {
				t = now
			}
			if !j.created.After(t) && (left == nil || left.After(t)) {
				depth[i]++
			}
		}
		if f := j.finished; f != nil && !f.Before(start) && f.Before(end) {
			i := int(f.Sub(start) / time.Hour)
			if j.state == "succeeded" {
				ok[i]++
			} else {
				bad[i]++
			}
		}
	}
	queue = chart{ID: "chart-queue", Caption: "Queue depth, last 24 h (UTC)", Labels: labels, Unit: "jobs", Series: []series{{Name: "queued", Values: depth}}}
	throughput = chart{ID: "chart-throughput", Caption: "Jobs ended per hour, last 24 h (UTC)", Labels: labels, Unit: "jobs",
		Series: []series{{Name: "succeeded", Values: ok}, {Name: "failed or canceled", Class: "alt", Values: bad}}}
	return queue, throughput
}

// spendChart draws the USD charged on each of the last ChartDays days
// (UTC), one GET /operator/costs each.
func (c *Console) spendChart(ctx context.Context, api *operator.Client) (chart, error) {
	now := c.cfg.Now().UTC()
	today := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	ch := chart{ID: "chart-spend", Caption: "Spend per day, last 14 days (UTC)", Unit: "USD", Digits: 4}
	usd := make([]float64, ChartDays)
	for i := range ChartDays {
		from := today.AddDate(0, 0, i-ChartDays+1)
		ch.Labels = append(ch.Labels, from.Format("01-02"))
		rep, err := api.Costs(ctx, operator.CostQuery{From: from, To: from.AddDate(0, 0, 1)})
		if err != nil {
			return chart{}, err
		}
		usd[i] = float64(rep.Total.CostMicroUSD) / 1e6
	}
	ch.Series = []series{{Name: "charged", Values: usd}}
	return ch, nil
}

// unpriced lists the groups of a by-SKU cost report charged 0 USD for
// GPU time above 0: SKUs the control plane has no price for.
func unpriced(rep *wire.CostReport) []string {
	if rep == nil {
		return nil
	}
	var out []string
	for _, g := range rep.Groups {
		if g.CostMicroUSD == 0 && g.ActualMS > 0 {
			out = append(out, g.Key)
		}
	}
	return out
}
