package receipts

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"time"
)

// msPerHour is the divisor of Cost: prices are per GPU-hour, durations
// in milliseconds.
const msPerHour = 3_600_000

// Cost returns the price, in micro-USD, of running gpus GPUs for ms
// milliseconds at ratePerGPUHour micro-USD per GPU-hour:
//
//	ceil(ms × gpus × ratePerGPUHour / 3,600,000)
//
// computed exactly in 128-bit integer arithmetic, so no product
// overflows and no rounding happens but the final one, up: any work at a
// positive rate costs at least one micro-USD. It returns ErrInvalidArgument
// if an argument is negative and ErrOverflow only if the cost itself does
// not fit in an int64.
func Cost(ms, gpus, ratePerGPUHour int64) (int64, error) {
	if ms < 0 || gpus < 0 || ratePerGPUHour < 0 {
		return 0, fmt.Errorf("%w: cost of %d ms on %d GPUs at %d: negative argument", ErrInvalidArgument, ms, gpus, ratePerGPUHour)
	}
	// ms × gpus fits in 128 bits; × rate, in 192: hi2:hi1:lo.
	h1, lo := bits.Mul64(uint64(ms), uint64(gpus))
	aHi, aLo := bits.Mul64(lo, uint64(ratePerGPUHour))
	bHi, bLo := bits.Mul64(h1, uint64(ratePerGPUHour))
	mid, carry := bits.Add64(aHi, bLo, 0)
	hi2 := bHi + carry
	lo = aLo
	// A product of 2^128 or more divides to far above MaxInt64, and so
	// does a middle word of msPerHour or more (Div64 would panic on it).
	if hi2 != 0 || mid >= msPerHour {
		return 0, fmt.Errorf("%w: cost of %d ms on %d GPUs at %d micro-USD per GPU-hour", ErrOverflow, ms, gpus, ratePerGPUHour)
	}
	q, r := bits.Div64(mid, lo, msPerHour)
	if q > math.MaxInt64 || (q == math.MaxInt64 && r != 0) {
		return 0, fmt.Errorf("%w: cost of %d ms on %d GPUs at %d micro-USD per GPU-hour", ErrOverflow, ms, gpus, ratePerGPUHour)
	}
	if r != 0 {
		q++
	}
	return int64(q), nil
}

// FormatMicros formats an amount of micro-USD as USD with exactly six
// decimals: 618 is "0.000618", 1_800_000 is "1.800000", -5 is "-0.000005".
func FormatMicros(micros int64) string {
	neg := micros < 0
	u := uint64(micros)
	if neg {
		u = -u // two's complement: right for math.MinInt64 too
	}
	s := strconv.FormatUint(u/1_000_000, 10) + "." + fmt.Sprintf("%06d", u%1_000_000)
	if neg {
		return "-" + s
	}
	return s
}

// ParseMicros parses what FormatMicros writes, and only that: an
// optional '-', the integer part without leading zeros, a dot and
// exactly six decimals. "-0.000000" is rejected, as FormatMicros never
// writes it. It returns ErrInvalidArgument for any other form and
// ErrOverflow for an amount beyond an int64 of micro-USD.
func ParseMicros(s string) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("%w: %q is not an amount with six decimals", ErrInvalidArgument, s)
	}
	digits, neg := strings.CutPrefix(s, "-")
	whole, frac, ok := strings.Cut(digits, ".")
	if !ok || len(frac) != 6 || whole == "" || (len(whole) > 1 && whole[0] == '0') || !allDigits(whole) || !allDigits(frac) {
		return bad()
	}
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrOverflow, s)
	}
	f, _ := strconv.ParseUint(frac, 10, 64)
	hi, u := bits.Mul64(w, 1_000_000)
	u, carry := bits.Add64(u, f, 0)
	limit := uint64(math.MaxInt64)
	if neg {
		limit++
	}
	if hi != 0 || carry != 0 || u > limit {
		return 0, fmt.Errorf("%w: %q", ErrOverflow, s)
	}
	if neg {
		if u == 0 {
			return bad()
		}
		return int64(-u), nil
	}
	return int64(u), nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Hours formats a duration in milliseconds as hours with exactly six
// decimals, rounded half up (half away from zero for a negative ms), in
// integer arithmetic: 1234 ms is "0.000343" (0.00034277... h), 1800 ms is
// "0.000500".
func Hours(ms int64) string {
	neg := ms < 0
	u := uint64(ms)
	if neg {
		u = -u
	}
	// Micro-hours = ms / 3.6 = ms × 5 / 18, rounded half up; split ms so
	// that nothing overflows.
	// u <= 2^63, so micro < 2^62 fits an int64.
	q, r := u/18, u%18
	micro := q*5 + (r*5+9)/18
	s := FormatMicros(int64(micro))
	if neg && micro != 0 {
		return "-" + s
	}
	return s
}

// DurationMS is the time from start to end in whole milliseconds,
// rounded up so that no started millisecond goes unbilled: 1 µs is 1 ms,
// 1 ms exactly is 1 ms. Like receipts, it works in microseconds: both
// times are truncated to the microsecond first. It returns
// ErrInvalidArgument if end is before start.
func DurationMS(start, end time.Time) (int64, error) {
	start, end = utcMicros(start), utcMicros(end)
	if end.Before(start) {
		return 0, fmt.Errorf("%w: end %s is before start %s", ErrInvalidArgument, FormatTime(end), FormatTime(start))
	}
	// Unix microseconds of years 1 to 9999 differ by far less than 2^63.
	us := end.UnixMicro() - start.UnixMicro()
	ms := us / 1000
	if us%1000 != 0 {
		ms++
	}
	return ms, nil
}

// Charge is what a finished job costs: how long it ran, on how many GPUs,
// at what rate, and the resulting amount, in the forms a job_charged
// receipt and the complete answer carry.
type Charge struct {
	StartedAt time.Time
	EndedAt   time.Time
	GPUCount  int64
	// RateMicros is the price per GPU-hour in micro-USD.
	RateMicros int64
	// ActualMS is EndedAt - StartedAt in whole milliseconds, rounded up
	// (see DurationMS).
	ActualMS int64
	// ActualHours is Hours(ActualMS).
	ActualHours string
	// CostMicros is Cost(ActualMS, GPUCount, RateMicros).
	CostMicros int64
	// ActualCostUSD is FormatMicros(CostMicros).
	ActualCostUSD string
}

// NewCharge computes the charge for gpus GPUs busy from start to end at
// ratePerGPUHour micro-USD per GPU-hour. Times are taken in UTC,
// truncated to microseconds, as receipts carry them. It returns
// ErrInvalidArgument if end is before start or a number is negative, and
// ErrOverflow if the cost does not fit in an int64.
//
// The gpus count is used as given: a job that asked for no GPU costs
// nothing, whatever the rate.
func NewCharge(start, end time.Time, gpus, ratePerGPUHour int64) (*Charge, error) {
	start, end = utcMicros(start), utcMicros(end)
	ms, err := DurationMS(start, end)
	if err != nil {
		return nil, err
	}
	cost, err := Cost(ms, gpus, ratePerGPUHour)
	if err != nil {
		return nil, err
	}
	return &Charge{
		StartedAt:     start,
		EndedAt:       end,
		GPUCount:      gpus,
		RateMicros:    ratePerGPUHour,
		ActualMS:      ms,
		ActualHours:   Hours(ms),
		CostMicros:    cost,
		ActualCostUSD: FormatMicros(cost),
	}, nil
}

// Receipt returns the job_charged receipt of the charge for a job and
// the worker that ran it, on GPU model sku ("" if none). The caller sets
// the rest (policy version, lease id) as it would for any receipt.
func (c *Charge) Receipt(jobID, workerID, sku string) Receipt {
	return Receipt{
		Kind:       KindJobCharged,
		JobID:      jobID,
		WorkerID:   workerID,
		GPUSKU:     sku,
		GPUCount:   c.GPUCount,
		RateMicros: c.RateMicros,
		StartedAt:  c.StartedAt,
		EndedAt:    c.EndedAt,
		ActualMS:   c.ActualMS,
		CostMicros: c.CostMicros,
	}
}

// Prices is the price table of GPU time: micro-USD per GPU-hour for each
// GPU SKU, and a default for SKUs it does not list. The zero Prices
// charges nothing. It implements flag.Value, so a command line can build
// it from repeated -price SKU=MICRO_USD_PER_GPU_HOUR flags.
type Prices struct {
	// BySKU maps a GPU SKU to its price in micro-USD per GPU-hour.
	BySKU map[string]int64
	// Default is the price of a SKU that BySKU does not list, and of a job
	// on no particular SKU.
	Default int64
}

// Rate returns the price per GPU-hour of sku, in micro-USD.
func (p *Prices) Rate(sku string) int64 {
	if r, ok := p.BySKU[sku]; ok && sku != "" {
		return r
	}
	return p.Default
}

// Validate returns ErrInvalidArgument if a price is negative or a SKU empty.
func (p *Prices) Validate() error {
	if p.Default < 0 {
		return fmt.Errorf("%w: default price %d is negative", ErrInvalidArgument, p.Default)
	}
	for sku, r := range p.BySKU {
		if sku == "" || r < 0 {
			return fmt.Errorf("%w: price %q=%d", ErrInvalidArgument, sku, r)
		}
	}
	return nil
}

// Set parses "SKU=MICRO_USD_PER_GPU_HOUR" (or "default=..." for the
// default price) and adds it to the table.
func (p *Prices) Set(s string) error {
	sku, v, ok := strings.Cut(s, "=")
	r, err := strconv.ParseInt(v, 10, 64)
	if !ok || sku == "" || err != nil || r < 0 {
		return fmt.Errorf("%w: price %q is not SKU=MICRO_USD_PER_GPU_HOUR", ErrInvalidArgument, s)
	}
	if sku == "default" {
		p.Default = r
		return nil
	}
	if p.BySKU == nil {
		p.BySKU = map[string]int64{}
	}
	p.BySKU[sku] = r
	return nil
}

// String lists the table as Set reads it, SKUs in order, default first.
func (p *Prices) String() string {
	if p == nil {
		return ""
	}
	out := []string{"default=" + strconv.FormatInt(p.Default, 10)}
	skus := make([]string, 0, len(p.BySKU))
	for sku := range p.BySKU {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		out = append(out, sku+"="+strconv.FormatInt(p.BySKU[sku], 10))
	}
	return strings.Join(out, ",")
}
