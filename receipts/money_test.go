package receipts_test

import (
	"errors"
	"flag"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nodelane/nodelane/receipts"
)

// bigCost is Cost in arbitrary precision, the reference the fast one is
// checked against.
func bigCost(ms, gpus, rate int64) (int64, bool) {
	p := new(big.Int).Mul(big.NewInt(ms), big.NewInt(gpus))
	p.Mul(p, big.NewInt(rate))
	q, r := new(big.Int).QuoRem(p, big.NewInt(3_600_000), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64(), q.IsInt64()
}

func TestCost(t *testing.T) {
	t.Parallel()
	const max = math.MaxInt64
	tests := []struct {
		name           string
		ms, gpus, rate int64
		want           int64
		err            error
	}{
		{"protocol example", 1234, 1, 1_802_000, 618, nil},
		{"exact hour", 3_600_000, 1, 1_800_000, 1_800_000, nil},
		{"1 ms at 1 micro-USD per GPU-hour", 1, 1, 1, 1, nil},
		{"1 ms at the smallest rate on many GPUs", 1, 8, 1, 1, nil},
		{"1 ms at a high rate", 1, 1, 3_600_000, 1, nil},
		{"1 ms just over a micro-USD", 1, 1, 3_600_001, 2, nil},
		{"zero duration", 0, 4, 2_000_000, 0, nil},
		{"no GPU", 1234, 0, 2_000_000, 0, nil},
		{"free", 1234, 1, 0, 0, nil},
		{"product beyond 64 bits, cost fits", 1 << 40, 1 << 20, 3_600_000, 1 << 60, nil},
		{"product beyond 64 bits, cost does not", max, 2, 3_600_000, 0, receipts.ErrOverflow},
		{"product beyond 128 bits", max, max, max, 0, receipts.ErrOverflow},
		{"largest cost", max, 1, 3_600_000, max, nil},
		{"one past the largest cost", max, 1, 3_600_001, 0, receipts.ErrOverflow},
		{"largest cost in other factors", max, 3_600_000, 1, max, nil},
		{"rounding up past the largest cost", max, 3_600_001, 1, 0, receipts.ErrOverflow},
		{"negative ms", -1, 1, 1, 0, receipts.ErrInvalidArgument},
		{"negative gpus", 1, -1, 1, 0, receipts.ErrInvalidArgument},
		{"negative rate", 1, 1, -1, 0, receipts.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := receipts.Cost(tc.ms, tc.gpus, tc.rate)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("Cost(%d, %d, %d) = %d, %v; want %v", tc.ms, tc.gpus, tc.rate, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Cost(%d, %d, %d) = %d, %v; want %d", tc.ms, tc.gpus, tc.rate, got, err, tc.want)
			}
			if want, _ := bigCost(tc.ms, tc.gpus, tc.rate); want != tc.want {
				t.Fatalf("the table is wrong: math/big says %d", want)
			}
		})
	}
}

// Cost agrees with math/big on random arguments of every magnitude, and
// any work at a positive rate costs at least one micro-USD.
func TestCostMatchesBig(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	arg := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return rng.Int64N(10)
		case 1:
			return rng.Int64N(1 << 20)
		case 2:
			return rng.Int64N(1 << 40)
		}
		return rng.Int64()
	}
	for range 200_000 {
		ms, gpus, rate := arg(), arg(), arg()
		got, err := receipts.Cost(ms, gpus, rate)
		want, fits := bigCost(ms, gpus, rate)
		if !fits {
			if !errors.Is(err, receipts.ErrOverflow) {
				t.Fatalf("Cost(%d, %d, %d) = %d, %v; want ErrOverflow", ms, gpus, rate, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Fatalf("Cost(%d, %d, %d) = %d, %v; want %d", ms, gpus, rate, got, err, want)
		}
		if ms > 0 && gpus > 0 && rate > 0 && got < 1 {
			t.Fatalf("Cost(%d, %d, %d) = %d: positive work is free", ms, gpus, rate, got)
		}
	}
}

func TestFormatParseMicros(t *testing.T) {
	t.Parallel()
	tests := []struct {
		micros int64
		s      string
	}{
		{0, "0.000000"},
		{618, "0.000618"},
		{1_800_000, "1.800000"},
		{123_456_789, "123.456789"},
		{-5, "-0.000005"},
		{math.MaxInt64, "9223372036854.775807"},
		{math.MinInt64, "-9223372036854.775808"},
	}
	for _, tc := range tests {
		if got := receipts.FormatMicros(tc.micros); got != tc.s {
			t.Errorf("FormatMicros(%d) = %q, want %q", tc.micros, got, tc.s)
		}
		if got, err := receipts.ParseMicros(tc.s); err != nil || got != tc.micros {
			t.Errorf("ParseMicros(%q) = %d, %v; want %d", tc.s, got, err, tc.micros)
		}
	}
	for _, tc := range []struct {
		s   string
		err error
	}{
		{"", receipts.ErrInvalidArgument},
		{"1", receipts.ErrInvalidArgument},
		{"1.5", receipts.ErrInvalidArgument},
		{"1.5000000", receipts.ErrInvalidArgument},
		{".500000", receipts.ErrInvalidArgument},
		{"01.500000", receipts.ErrInvalidArgument},
		{"+1.500000", receipts.ErrInvalidArgument},
		{"-0.000000", receipts.ErrInvalidArgument},
		{"1,500000", receipts.ErrInvalidArgument},
		{"1.5e0000", receipts.ErrInvalidArgument},
		{" 1.500000", receipts.ErrInvalidArgument},
		{"9223372036854.775808", receipts.ErrOverflow},
		{"-9223372036854.775809", receipts.ErrOverflow},
		{"99999999999999999999.000000", receipts.ErrOverflow},
	} {
		if got, err := receipts.ParseMicros(tc.s); !errors.Is(err, tc.err) {
			t.Errorf("ParseMicros(%q) = %d, %v; want %v", tc.s, got, err, tc.err)
		}
	}
}

func TestHours(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ms   int64
		want string
	}{
		{0, "0.000000"},
		{1, "0.000000"},    // 0.28 micro-hours
		{2, "0.000001"},    // 0.56
		{9, "0.000003"},    // 2.5 exactly: half up
		{1234, "0.000343"}, // the protocol's example
		{1800, "0.000500"},
		{3_600_000, "1.000000"},
		{5_400_000, "1.500000"},
		{-9, "-0.000003"},
		{-1, "0.000000"},
		{math.MaxInt64, "2562047788015.215502"},
		{math.MinInt64, "-2562047788015.215502"},
	}
	for _, tc := range tests {
		if got := receipts.Hours(tc.ms); got != tc.want {
			t.Errorf("Hours(%d) = %q, want %q", tc.ms, got, tc.want)
		}
	}
	// Against math/big, half up.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		ms := rng.Int64N(1 << uint(rng.IntN(62)+1))
		num := new(big.Int).Mul(big.NewInt(ms), big.NewInt(10))
		num.Add(num, big.NewInt(18))
		micro := num.Quo(num, big.NewInt(36)).Int64() // floor((ms/3.6) + 0.5)
		if got, want := receipts.Hours(ms), receipts.FormatMicros(micro); got != want {
			t.Fatalf("Hours(%d) = %s, want %s", ms, got, want)
		}
	}
}

func TestNewCharge(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		end        time.Time
		gpus, rate int64
		ms         int64
		hours      string
		cost       string
		err        error
	}{
		{"protocol example", start.Add(1234 * time.Millisecond), 1, 1_802_000, 1234, "0.000343", "0.000618", nil},
		{"a microsecond bills a millisecond", start.Add(time.Microsecond), 1, 1, 1, "0.000000", "0.000001", nil},
		{"1 ms at any positive rate costs something", start.Add(time.Millisecond), 1, 1, 1, "0.000000", "0.000001", nil},
		{"nanoseconds are dropped", start.Add(999 * time.Nanosecond), 1, 1_000_000, 0, "0.000000", "0.000000", nil},
		{"two GPUs for an hour", start.Add(time.Hour), 2, 2_500_000, 3_600_000, "1.000000", "5.000000", nil},
		{"end before start", start.Add(-time.Microsecond), 1, 1, 0, "", "", receipts.ErrInvalidArgument},
		{"negative rate", start.Add(time.Second), 1, -1, 0, "", "", receipts.ErrInvalidArgument},
		{"price overflow", start.Add(24 * time.Hour), 1 << 20, math.MaxInt64 / 2, 0, "", "", receipts.ErrOverflow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := receipts.NewCharge(start, tc.end, tc.gpus, tc.rate)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("NewCharge = %+v, %v; want %v", c, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.ActualMS != tc.ms || c.ActualHours != tc.hours || c.ActualCostUSD != tc.cost {
				t.Errorf("NewCharge = %d ms, %s h, %s USD; want %d, %s, %s", c.ActualMS, c.ActualHours, c.ActualCostUSD, tc.ms, tc.hours, tc.cost)
			}
			// Its receipt encodes and agrees with itself.
			r := c.Receipt("job_1", "wrk_1", "")
			r.ID, r.ServerTime = "rcp_1", start
			b, err := r.Encode()
			if err != nil {
				t.Fatalf("the charge's receipt does not encode: %v", err)
			}
			if _, err := receipts.Decode(b); err != nil {
				t.Fatalf("the charge's receipt does not decode: %v", err)
			}
		})
	}
}

func TestPrices(t *testing.T) {
	t.Parallel()
	var p receipts.Prices
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.Var(&p, "price", "SKU=MICRO_USD_PER_GPU_HOUR")
	if err := fs.Parse([]string{"-price", "rtx-4090=1800000", "-price", "default=900000", "-price", "h100=4500000"}); err != nil {
		t.Fatal(err)
	}
	for sku, want := range map[string]int64{"rtx-4090": 1_800_000, "h100": 4_500_000, "a10": 900_000, "": 900_000} {
		if got := p.Rate(sku); got != want {
			t.Errorf("Rate(%q) = %d, want %d", sku, got, want)
		}
	}
	if got, want := p.String(), "default=900000,h100=4500000,rtx-4090=1800000"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if err := p.Validate(); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"rtx-4090", "=5", "a10=-1", "a10=1.5", "a10="} {
		if err := p.Set(bad); !errors.Is(err, receipts.ErrInvalidArgument) {
			t.Errorf("Set(%q) err = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if err := (&receipts.Prices{Default: -1}).Validate(); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("Validate(negative default) = %v", err)
	}
	var zero receipts.Prices
	if zero.Rate("rtx-4090") != 0 {
		t.Error("the zero Prices charges")
	}
}
