package datapath

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
)

func TestParseFio(t *testing.T) {
	// A real report: fio 3.33, --output-format=json, 4 KiB randwrite.
	real, err := os.ReadFile("testdata/fio-3.33-randwrite.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		out       string
		wantIOPS  float64
		wantMiBps float64
		wantErr   string
	}{
		{name: "report", out: string(real), wantIOPS: 6322.355289, wantMiBps: 25289.0 / 1024},
		{name: "a note before the report", out: "fio: file hash not empty on exit\n" + string(real), wantIOPS: 6322.355289, wantMiBps: 25289.0 / 1024},
		{name: "job error", out: strings.Replace(string(real), `"error" : 0`, `"error" : 5`, 1), wantErr: "error"},
		{name: "no report", out: "fio: pid=0, err=2/file:filesetup.c", wantErr: "read fio's report"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseFio([]byte(tt.out), "")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(r.IOPS-tt.wantIOPS) > 1e-6 || math.Abs(r.MiBps-tt.wantMiBps) > 1e-6 {
				t.Errorf("got %.6f IOPS %.6f MiB/s, want %.6f and %.6f", r.IOPS, r.MiBps, tt.wantIOPS, tt.wantMiBps)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"1G", 1 << 30}, {"512M", 512 << 20}, {"64K", 64 << 10}, {"4096", 4096},
		{"", 0}, {"G", 0}, {"-1G", 0}, {"1T", 0}, {"1.5G", 0},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if tt.want == 0 {
			if err == nil {
				t.Errorf("parseSize(%q) = %d, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestMedianAndLine(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median of 3 = %v, want 2", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 4 = %v, want 2.5", got)
	}
	l := Line{Mode: "loop/direct-io", Workload: "randwrite-4k", Volume: 900, Backing: 1000, Unit: "IOPS", Ratio: 0.9}
	want := "datapath loop/direct-io randwrite-4k: volume 900 IOPS, backing 1000 IOPS, ratio 0.90"
	if l.String() != want {
		t.Errorf("line = %q, want %q", l.String(), want)
	}
}

func TestDescribeAES(t *testing.T) {
	block := func(name, driver, module string, priority int) string {
		return fmt.Sprintf("name         : %s\ndriver       : %s\nmodule       : %s\npriority     : %d\nrefcnt       : 1\nselftest     : passed\ninternal     : no\ntype         : skcipher\n", name, driver, module, priority)
	}
	aesni := block("xts(aes)", "xts-aes-aesni", "aesni_intel", 401)
	generic := block("xts(aes)", "xts(ecb(aes-generic))", "kernel", 100)
	plainAES := block("aes", "aes-generic", "kernel", 100)
	for _, tc := range []struct {
		name, cpuinfo, crypto, want string
	}{
		{"aes-ni picked over generic", "processor\t: 0\nflags\t\t: fpu sse2 aes avx\n", generic + "\n" + aesni + "\n" + plainAES,
			"aes CPU flag, xts(aes) by xts-aes-aesni (priority 401)"},
		{"no aes flag, generic", "flags\t\t: fpu sse2 avx\n", plainAES + "\n" + generic, "no aes CPU flag, xts(aes) by xts(ecb(aes-generic)) (priority 100)"},
		{"xts not loaded", "flags\t\t: aes\n", plainAES, "aes CPU flag, xts(aes) not loaded"},
		{"aes inside another flag's name", "flags\t\t: vaes\n", "", "no aes CPU flag, xts(aes) not loaded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeAES(tc.cpuinfo, tc.crypto); got != tc.want {
				t.Errorf("describeAES = %q, want %q", got, tc.want)
			}
		})
	}
}
