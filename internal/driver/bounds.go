package driver

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// Every request is bounded before anything uses or logs it: a 3 MiB name
// that is refused anyway must not cost a 40 MB log line, and a 1 MiB
// mkfsOptions must not reach mkfs. The bounds are far above anything
// Kubernetes sends and far below what would cost memory.
const (
	// maxString is the longest string field, unless fieldLimits says
	// otherwise: long enough for a path (PATH_MAX is 4096).
	maxString = 4096
	// maxMapEntries and maxListEntries bound every map and repeated field.
	maxMapEntries  = 64
	maxListEntries = 64
	// maxMapKey bounds a map's keys (a Kubernetes parameter key is at most
	// 253 + 1 + 63 bytes).
	maxMapKey = 320
	// maxSecretValue bounds a secret's value: room for a certificate chain.
	maxSecretValue = 64 << 10
	// maxDepth bounds the nesting of messages (a CSI request nests 4 deep).
	maxDepth = 16
)

// fieldLimits are the tighter bounds of fields whose values Spindle makes
// or knows, by field name.
var fieldLimits = map[protoreflect.Name]int{
	"name":             maxNameLength,
	"volume_id":        volumeIDLimit,
	"source_volume_id": volumeIDLimit,
	"snapshot_id":      volumeIDLimit,
	"node_id":          256,
	"starting_token":   256,
	"fs_type":          64,
	"mount_flags":      1024,
}

// volumeIDLimit is looser than volumeid's own 128 bytes, so that an ID of
// another driver is answered NOT_FOUND by the lookup, as the spec asks,
// rather than INVALID_ARGUMENT here.
const volumeIDLimit = 1024

// checkBounds refuses a request with a string, map or list beyond its
// bound, naming the field and the bound and never echoing the value.
func checkBounds(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		if err := boundMessage(m.ProtoReflect(), "", 0); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

func boundMessage(m protoreflect.Message, prefix string, depth int) error {
	if depth > maxDepth {
		return errdefs.InvalidArgument("%s nests messages more than %d deep", orRequest(prefix), maxDepth)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = boundField(fd, v, prefix+string(fd.Name()), depth)
		return err == nil
	})
	return err
}

func orRequest(prefix string) string {
	if prefix == "" {
		return "the request"
	}
	return prefix
}

func boundField(fd protoreflect.FieldDescriptor, v protoreflect.Value, field string, depth int) error {
	switch {
	case fd.IsMap():
		mp := v.Map()
		if mp.Len() > maxMapEntries {
			return errdefs.InvalidArgument("%s has %d entries; the maximum is %d", field, mp.Len(), maxMapEntries)
		}
		valueLimit := maxString
		if isSecret(fd) {
			valueLimit = maxSecretValue
		}
		var err error
		mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			key := k.String()
			if len(key) > maxMapKey {
				err = errdefs.InvalidArgument("%s has a key of %d bytes; the maximum is %d", field, len(key), maxMapKey)
				return false
			}
			entry := field + "[" + strconv.Quote(key) + "]"
			if isSecret(fd) {
				entry = field + " entry" // secrets' keys stay out of messages too
			}
			switch fd.MapValue().Kind() {
			case protoreflect.StringKind:
				err = boundString(entry, mv.String(), valueLimit)
			case protoreflect.MessageKind:
				err = boundMessage(mv.Message(), entry+".", depth+1)
			}
			return err == nil
		})
		return err
	case fd.IsList():
		list := v.List()
		if list.Len() > maxListEntries {
			return errdefs.InvalidArgument("%s has %d entries; the maximum is %d", field, list.Len(), maxListEntries)
		}
		for i := 0; i < list.Len(); i++ {
			item := fmt.Sprintf("%s[%d]", field, i)
			switch fd.Kind() {
			case protoreflect.StringKind:
				if err := boundString(item, list.Get(i).String(), limitOf(fd)); err != nil {
					return err
				}
			case protoreflect.BytesKind:
				if err := boundString(item, string(list.Get(i).Bytes()), maxString); err != nil {
					return err
				}
			case protoreflect.MessageKind:
				if err := boundMessage(list.Get(i).Message(), item+".", depth+1); err != nil {
					return err
				}
			}
		}
	case fd.Kind() == protoreflect.StringKind:
		return boundString(field, v.String(), limitOf(fd))
	case fd.Kind() == protoreflect.BytesKind:
		return boundString(field, string(v.Bytes()), maxString)
	case fd.Kind() == protoreflect.MessageKind:
		return boundMessage(v.Message(), field+".", depth+1)
	}
	return nil
}

func limitOf(fd protoreflect.FieldDescriptor) int {
	if n, ok := fieldLimits[fd.Name()]; ok {
		return n
	}
	if isSecret(fd) {
		return maxSecretValue
	}
	return maxString
}

func boundString(field, s string, limit int) error {
	if len(s) > limit {
		return errdefs.InvalidArgument("%s is %d bytes long; the maximum is %d", field, len(s), limit)
	}
	return nil
}

// maxRequestBytes bounds a whole request, far above what any CSI request
// needs (a few KiB). A larger one is not decoded at all, so that sixteen
// 3 MiB requests at once cost their bytes on the wire and nothing more.
const maxRequestBytes = 1 << 20

// lenientCodec decodes requests as grpc-go's proto codec does, except that
// a request it cannot decode (invalid UTF-8 in a string, a malformed
// message) or will not (over maxRequestBytes) is not answered INTERNAL
// before any interceptor sees it: the message is left empty and the reason
// kept for checkDecoded, which answers INVALID_ARGUMENT through the
// interceptors, so it is logged and counted like every other refusal.
type lenientCodec struct {
	encoding.CodecV2
	undecoded sync.Map // proto.Message -> error
}

func newLenientCodec() *lenientCodec {
	return &lenientCodec{CodecV2: encoding.GetCodecV2("proto")}
}

func (c *lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if ok && data.Len() > maxRequestBytes {
		c.undecoded.Store(m, tooLarge(data, m.ProtoReflect().Descriptor()))
		return nil
	}
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil || !ok {
		return err
	}
	proto.Reset(m)
	c.undecoded.Store(m, fmt.Errorf("%w (%d bytes)", err, data.Len()))
	return nil
}

// tooLarge says how large the request is and which of its fields holds the
// most, read from the wire format without decoding anything.
func tooLarge(data mem.BufferSlice, desc protoreflect.MessageDescriptor) error {
	total := data.Len()
	r := data.Reader()
	defer r.Close()
	largest, largestBytes := "", 0
	for r.Remaining() > 0 {
		tag, err := binary.ReadUvarint(r)
		if err != nil {
			break
		}
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		n := 0
		switch typ {
		case protowire.VarintType:
			_, err = binary.ReadUvarint(r)
		case protowire.Fixed32Type:
			n = 4
		case protowire.Fixed64Type:
			n = 8
		case protowire.BytesType:
			var l uint64
			l, err = binary.ReadUvarint(r)
			n = int(min(l, uint64(r.Remaining())))
		default:
			err = fmt.Errorf("wire type %d", typ)
		}
		if err != nil {
			break
		}
		if _, err := r.Discard(n); err != nil {
			break
		}
		name := fmt.Sprintf("field %d", num)
		if fd := desc.Fields().ByNumber(num); fd != nil {
			name = string(fd.Name())
		}
		if n > largestBytes {
			largest, largestBytes = name, n
		}
	}
	if largest == "" {
		return fmt.Errorf("the request is %d bytes long; the maximum is %d", total, maxRequestBytes)
	}
	return fmt.Errorf("the request is %d bytes long, of which %s holds %d; the maximum is %d", total, largest, largestBytes, maxRequestBytes)
}

// checkDecoded answers a request lenientCodec could not decode.
func (c *lenientCodec) checkDecoded(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err, ok := c.undecoded.LoadAndDelete(req); ok {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, err.(error), "the request was not decoded")
	}
	return handler(ctx, req)
}
