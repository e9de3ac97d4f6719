package console

import "testing"

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 1048575: "1.0 MiB",
		64 << 20: "64.0 MiB", 10 << 30: "10.0 GiB", 1<<63 - 1: "8.0 EiB",
	} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
