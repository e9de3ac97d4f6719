package jobs

import "testing"

func TestParseGPU(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		sku  string
		vram int
		ok   bool
	}{
		{"rtx-4090:24576", "rtx-4090", 24576, true},
		{"a100-80g:81920", "a100-80g", 81920, true},
		{"rtx-4090", "", 0, false},
		{":1", "", 0, false},
		{"x:0", "", 0, false},
		{"x:-1", "", 0, false},
		{"x:abc", "", 0, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			g, err := ParseGPU(tc.in)
			if (err == nil) != tc.ok || g.SKU != tc.sku || g.VRAMMB != tc.vram {
				t.Errorf("ParseGPU(%q) = %+v, %v", tc.in, g, err)
			}
		})
	}
}

func TestRegistration(t *testing.T) {
	t.Parallel()
	r := Registration("n1", "", nil, 2)
	if r.NodeID != "n1" || r.Name != "n1" || r.GovernorLimits.MaxJobs != 2 || len(r.Capabilities.JobTypes) != 3 {
		t.Errorf("Registration = %+v", r)
	}
}
