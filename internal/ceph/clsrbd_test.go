package ceph

import (
	"bytes"
	"maps"
	"testing"
	"time"
)

// The encodings, byte for byte as Ceph's encode() writes them.
func TestClsEncoding(t *testing.T) {
	got := encodeMap(map[string]string{"b": "22", "a": ""})
	want := []byte{2, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 0, 0, 0, 1, 0, 0, 0, 'b', 2, 0, 0, 0, '2', '2'}
	if !bytes.Equal(got, want) {
		t.Fatalf("encodeMap = %v, want %v", got, want)
	}
	m, err := decodeMap(got)
	if err != nil || !maps.Equal(m, map[string]string{"a": "", "b": "22"}) {
		t.Fatalf("decodeMap = %v, %v", m, err)
	}
	for i := range len(got) - 1 {
		if _, err := decodeMap(got[:i]); err == nil {
			t.Fatalf("decodeMap of the first %d bytes: no error", i)
		}
	}
	if got, want := encodeListArgs("k", 7), []byte{1, 0, 0, 0, 'k', 7, 0, 0, 0, 0, 0, 0, 0}; !bytes.Equal(got, want) {
		t.Fatalf("encodeListArgs = %v, want %v", got, want)
	}
	if s, rest, err := decodeString([]byte{3, 0, 0, 0, 'a', 'b', 'c', 9}); s != "abc" || !bytes.Equal(rest, []byte{9}) || err != nil {
		t.Fatalf("decodeString = %q %v %v", s, rest, err)
	}
	snapc := []byte{9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0}
	if n, err := decodeSnapCount(snapc); n != 2 || err != nil {
		t.Fatalf("decodeSnapCount = %d, %v; want 2", n, err)
	}
	if _, err := decodeSnapCount(snapc[:len(snapc)-1]); err == nil {
		t.Fatal("decodeSnapCount of a cut answer: no error")
	}
	if size, err := decodeSize([]byte{22, 0, 0, 0, 64, 0, 0, 0, 0}); size != 1<<30 || err != nil {
		t.Fatalf("decodeSize = %d, %v; want 1 GiB", size, err)
	}
	if at, err := decodeTime([]byte{0x10, 0, 0, 0x60, 5, 0, 0, 0}); !at.Equal(time.Unix(0x60000010, 5)) || err != nil {
		t.Fatalf("decodeTime = %v, %v", at, err)
	}
	for _, tc := range []struct {
		keys []string
		want bool
	}{{[]string{"spindle.name", "spindle.volume"}, true}, {[]string{"spindle.name", "conf_rbd_qos_iops_limit"}, false}, {nil, true}} {
		if got := directMetadata(tc.keys); got != tc.want {
			t.Errorf("directMetadata(%q) = %v, want %v", tc.keys, got, tc.want)
		}
	}
}
