// Package errdefs holds the few kinds of failure that cross package
// boundaries in Spindle. Backends and the node data path build their errors
// on these kinds; internal/driver maps each kind to one gRPC code, in one
// place, so no other package needs to know about gRPC.
package errdefs

import (
	"errors"
	"fmt"
)

// The kinds. Compare with errors.Is; build with the constructors below so the
// message reads as a sentence rather than as "not found: ...".
var (
	// ErrInvalidArgument: the caller asked for something malformed or unsupported.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: the volume, image, node or path does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: it exists, but with parameters other than the ones asked for.
	ErrAlreadyExists = errors.New("already exists")
	// ErrOutOfRange: a size that cannot be met (too small, too large, a shrink).
	ErrOutOfRange = errors.New("out of range")
	// ErrExhausted: no space, no free device, attach limit reached.
	ErrExhausted = errors.New("resource exhausted")
	// ErrPrecondition: the system is not in a state where the operation is safe
	// (published elsewhere, holds another filesystem, still in use, ...).
	ErrPrecondition = errors.New("failed precondition")
	// ErrBusy: another operation holds the resource right now; retry later.
	ErrBusy = errors.New("busy")
	// ErrUnavailable: the backend cannot be reached.
	ErrUnavailable = errors.New("unavailable")
)

// kindError carries a kind, a human message and an optional cause.
type kindError struct {
	kind  error
	msg   string
	cause error
}

func (e *kindError) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + ": " + e.cause.Error()
}

func (e *kindError) Is(target error) bool { return target == e.kind }
func (e *kindError) Unwrap() error        { return e.cause }

func newf(kind error, cause error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...), cause: cause}
}

// Wrap attaches kind and a message to cause. A nil cause gives a plain error of that kind.
func Wrap(kind, cause error, format string, args ...any) error {
	return newf(kind, cause, format, args...)
}

func InvalidArgument(format string, args ...any) error {
	return newf(ErrInvalidArgument, nil, format, args...)
}
func NotFound(format string, args ...any) error { return newf(ErrNotFound, nil, format, args...) }
func AlreadyExists(format string, args ...any) error {
	return newf(ErrAlreadyExists, nil, format, args...)
}
func OutOfRange(format string, args ...any) error { return newf(ErrOutOfRange, nil, format, args...) }
func Exhausted(format string, args ...any) error  { return newf(ErrExhausted, nil, format, args...) }
func Precondition(format string, args ...any) error {
	return newf(ErrPrecondition, nil, format, args...)
}
func Busy(format string, args ...any) error { return newf(ErrBusy, nil, format, args...) }
func Unavailable(format string, args ...any) error {
	return newf(ErrUnavailable, nil, format, args...)
}

// KindOf returns the outermost kind in err's chain, or nil when err carries
// none. The outermost wins because it is the most specific statement about
// what went wrong: a "not found" deep inside a "precondition" was the reason
// for the precondition, not the answer to the caller.
//
// A bare sentinel wrapped with fmt.Errorf("...: %w", ErrNotFound) counts too,
// so an error built the ordinary Go way is not mistaken for an internal one.
func KindOf(err error) error {
	var ke *kindError
	if errors.As(err, &ke) {
		return ke.kind
	}
	for _, kind := range kinds {
		if errors.Is(err, kind) {
			return kind
		}
	}
	return nil
}

var kinds = []error{ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrOutOfRange, ErrExhausted, ErrPrecondition, ErrBusy, ErrUnavailable}
