package volumeid

import (
	"errors"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    ID
		wantErr string // substring of the error; "" means success
	}{
		{in: "loop/default/pvc-6f1c", want: ID{"loop", "default", "pvc-6f1c"}},
		{in: "rbd/ceph-a/kube/csi-vol-1", want: ID{"rbd", "ceph-a", "kube/csi-vol-1"}},
		{in: "iscsi/tgt1/vol_1.a", want: ID{"iscsi", "tgt1", "vol_1.a"}},
		{in: "", wantErr: "empty"},
		{in: "loop/default", wantErr: "not of the form"},
		{in: "fake-vol-id", wantErr: "not of the form"},
		{in: "loop//img", wantErr: "instance"},
		{in: "loop/default/", wantErr: "image name is empty"},
		{in: "loop/default/a//b", wantErr: "empty segment"},
		{in: "loop/default/../etc", wantErr: `".."`},
		{in: "loop/default/a..b", wantErr: `".."`},
		{in: "loop/default/.hidden", wantErr: "starts with '.'"},
		{in: "loop/default/-x", wantErr: "starts with '.' or '-'"},
		{in: "loop/default/a b", wantErr: "characters outside"},
		{in: "loop/default/a\x00b", wantErr: "characters outside"},
		{in: "Loop/default/a", wantErr: "backend"},
		{in: "loop/Default/a", wantErr: "instance"},
		{in: "loop/default/" + strings.Repeat("a", 116), wantErr: "maximum is 128"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse(%q) = %+v, want an error containing %q", tt.in, got, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %q, want it to contain %q", tt.in, err, tt.wantErr)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("Parse(%q) error kind = %v, want InvalidArgument", tt.in, errdefs.KindOf(err))
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			if got.String() != tt.in {
				t.Fatalf("round trip: %q -> %q", tt.in, got.String())
			}
		})
	}
}

func TestNewRejectsTooLong(t *testing.T) {
	if _, err := New("loop", "default", strings.Repeat("x", 115)); err != nil {
		t.Fatalf("115-byte image should fit exactly: %v", err)
	}
	if _, err := New("loop", "default", strings.Repeat("x", 116)); err == nil {
		t.Fatal("129-byte ID accepted")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"loop/default/pvc-1", "rbd/a/p/i", "../..", "a/b/c/../d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		// Anything accepted must be safe to join to a directory.
		if strings.Contains(id.Image, "..") || strings.HasPrefix(id.Image, "/") || strings.Contains(id.Image, "//") {
			t.Fatalf("Parse accepted unsafe image %q", id.Image)
		}
		if id.String() != s {
			t.Fatalf("round trip %q -> %q", s, id.String())
		}
	})
}
