package ceph

import (
	"encoding/binary"
	"errors"
	"slices"
	"time"
)

// Image metadata without opening the image. librbd's own metadata calls
// open the image read-write (its header read, a watch registered), make
// one object-class call per key on the image's header object and notify
// every client that has the image open, then close it: 10 to 20 ms for the
// two keys of a new volume on an idle cluster. The object-class calls
// themselves (cls_rbd's metadata_set, metadata_remove, metadata_list,
// metadata_get on rbd_header.<id>) take one round trip for all keys, and
// are what librbd's clone, rbd-mirror and migration make directly on
// images they do not open. The notify only matters to clients that cache
// a key: librbd caches the conf_ keys (per-image configuration), so those
// still go through librbd (directMetadata).
//
// The arguments and answers are in Ceph's encoding: a string is its
// length (uint32, little-endian) and its bytes, a uint64 is 8 bytes
// little-endian, a map is its length and then each key and value.

// headSnapID is CEPH_NOSNAP: the image's head, to get_size.
const headSnapID = ^uint64(1)

// decodeSize decodes get_size's answer: the object order and the size.
func decodeSize(b []byte) (uint64, error) {
	if len(b) < 9 {
		return 0, errShortAnswer
	}
	return binary.LittleEndian.Uint64(b[1:9]), nil
}

// decodeFeatures decodes get_features's answer: the feature bits, then
// those of them a client must know to open the image.
func decodeFeatures(b []byte) (uint64, error) {
	if len(b) < 16 {
		return 0, errShortAnswer
	}
	return binary.LittleEndian.Uint64(b), nil
}

// decodeTime decodes a utime_t (get_create_timestamp's answer): seconds
// and nanoseconds.
func decodeTime(b []byte) (time.Time, error) {
	if len(b) < 8 {
		return time.Time{}, errShortAnswer
	}
	return time.Unix(int64(binary.LittleEndian.Uint32(b)), int64(binary.LittleEndian.Uint32(b[4:8]))), nil
}

// decodeSnapCount decodes get_snapcontext's answer (the snapshot
// sequence number, then the snapshot IDs) to the number of snapshots.
func decodeSnapCount(b []byte) (int, error) {
	if len(b) < 12 {
		return 0, errShortAnswer
	}
	n := binary.LittleEndian.Uint32(b[8:12])
	if uint64(len(b)-12) < 8*uint64(n) {
		return 0, errShortAnswer
	}
	return int(n), nil
}

// Object names of a format-2 image (librbd's RBD_ID_PREFIX and
// RBD_HEADER_PREFIX).
const (
	idObjectPrefix     = "rbd_id."
	headerObjectPrefix = "rbd_header."
)

// directMetadata reports whether metadata keys may be set without
// librbd: none is a per-image configuration key (conf_*), which clients
// that have the image open must be told of.
func directMetadata(keys []string) bool {
	for _, k := range keys {
		if len(k) >= 5 && k[:5] == "conf_" {
			return false
		}
	}
	return true
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// encodeMap encodes a map<string, bufferlist>, keys in order.
func encodeMap(kv map[string]string) []byte {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(keys)))
	for _, k := range keys {
		b = appendString(appendString(b, k), kv[k])
	}
	return b
}

// encodeListArgs encodes metadata_list's arguments: the key to start
// after and how many to return at most.
func encodeListArgs(after string, max uint64) []byte {
	return binary.LittleEndian.AppendUint64(appendString(nil, after), max)
}

var errShortAnswer = errors.New("object class answer ends early")

func decodeString(b []byte) (string, []byte, error) {
	if len(b) < 4 {
		return "", nil, errShortAnswer
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(len(b)) < uint64(n) {
		return "", nil, errShortAnswer
	}
	return string(b[:n]), b[n:], nil
}

// decodeMap decodes a map<string, bufferlist>.
func decodeMap(b []byte) (map[string]string, error) {
	if len(b) < 4 {
		return nil, errShortAnswer
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	out := make(map[string]string, min(n, 1024))
	for range n {
		var k, v string
		var err error
		if k, b, err = decodeString(b); err != nil {
			return nil, err
		}
		if v, b, err = decodeString(b); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}
