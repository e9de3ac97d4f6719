package console

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestRelativeAndDur(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "just now"}, {-3 * time.Second, "just now"}, {-42 * time.Second, "42 s ago"}, {-5 * time.Minute, "5 min ago"},
		{-3 * time.Hour, "3 h ago"}, {-47 * time.Hour, "47 h ago"}, {-72 * time.Hour, "3 d ago"}, {2 * time.Hour, "in 2 h"},
		{-40 * 24 * time.Hour, "2026-10-26"},
	} {
		if got := relative(now, now.Add(c.d)); got != c.want {
			t.Errorf("relative(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	got := string(when(now, now.Add(-5*time.Minute)))
	if want := `<time datetime="2026-12-05T11:55:00Z" title="2026-12-05 11:55:00Z">5 min ago</time>`; got != want {
		t.Errorf("when = %s, want %s", got, want)
	}
	if got := when(now, (*time.Time)(nil)); got != "—" {
		t.Errorf("when(nil) = %q", got)
	}
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{850 * time.Millisecond, "850 ms"}, {42500 * time.Millisecond, "42.5 s"}, {185 * time.Second, "3 min 5 s"},
		{130 * time.Minute, "2 h 10 min"}, {76 * time.Hour, "3 d 4 h"},
	} {
		if got := dur(now, now.Add(c.d)); got != c.want {
			t.Errorf("dur(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	later := now.Add(time.Hour)
	if got := dur(later, now); got != "—" {
		t.Errorf("dur backwards = %q", got)
	}
	if got := dur(now, (*time.Time)(nil)); got != "—" {
		t.Errorf("dur to nil = %q", got)
	}
}

func TestCheckJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, where string
		offset    int64
	}{
		{`{"a": 1}`, "", 0},
		{"{\"a\": 1,\n \"b\": ]}", "line 2, column 7", 15},
		{`{"a": "é", x}`, "line 1, column 12", 12},
		{`{"a": 1`, "line 1, column 8", 7},
		{`{} {}`, "line 1, column 4", 3}, {"{}\n\t ", "", 0},
	} {
		err := checkJSON(c.in)
		if c.where == "" {
			if err != nil {
				t.Errorf("checkJSON(%q) = %v", c.in, err.msg)
			}
			continue
		}
		if err == nil || !strings.HasSuffix(err.msg, " at "+c.where) || err.offset != c.offset {
			t.Errorf("checkJSON(%q) = %+v, want at %s, offset %d", c.in, err, c.where, c.offset)
		}
	}
}

func TestPrettyKeepsMarkupReadable(t *testing.T) {
	t.Parallel()
	got := pretty(json.RawMessage(`{"note":"<script>&</script>"}`))
	if want := "{\n  \"note\": \"<script>&</script>\"\n}"; got != want {
		t.Errorf("pretty = %q, want %q", got, want)
	}
	if got := pretty(nil); got != "" {
		t.Errorf("pretty(nil) = %q", got)
	}
}

func TestChartSVG(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 30, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	q, tp := hourCharts(now, []jobTimes{
		{state: "queued", created: now.Add(-80 * time.Minute)},
		{state: "succeeded", created: now.Add(-5 * time.Hour), leased: at(-4 * time.Hour), finished: at(-3*time.Hour - 10*time.Minute)},
		{state: "failed", created: now.Add(-2 * time.Hour), leased: at(-2 * time.Hour), finished: at(-10 * time.Minute)},
	})
	// The queued job counts in the last two buckets; the succeeded one
	// from its creation to its lease.
	depth := q.Series[0].Values
	if depth[23] != 1 || depth[22] != 1 || depth[21] != 0 || depth[19] != 0 || depth[18] != 1 || depth[17] != 0 {
		t.Errorf("queue depth = %v", depth)
	}
	if ok, bad := tp.Series[0].Values, tp.Series[1].Values; ok[20] != 1 || bad[23] != 1 {
		t.Errorf("throughput = %v / %v", ok, bad)
	}
	svg := string(chart{ID: "x", Caption: `a <b> "c"`, Labels: []string{"<1>", "2"}, Unit: "jobs", Series: []series{{Name: "n", Values: []float64{1, 2}}}}.SVG())
	if strings.Contains(svg, "<b>") || strings.Contains(svg, "<1>") || strings.Count(svg, "<rect ") != 2 || !strings.Contains(svg, `aria-label="a &lt;b&gt; &#34;c&#34;"`) {
		t.Errorf("svg = %s", svg)
	}
}
