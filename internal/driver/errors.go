package driver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// codeOf is the one mapping from Spindle's error kinds to gRPC codes.
func codeOf(err error) codes.Code {
	switch errdefs.KindOf(err) {
	case errdefs.ErrInvalidArgument:
		return codes.InvalidArgument
	case errdefs.ErrNotFound:
		return codes.NotFound
	case errdefs.ErrAlreadyExists:
		return codes.AlreadyExists
	case errdefs.ErrOutOfRange:
		return codes.OutOfRange
	case errdefs.ErrExhausted:
		return codes.ResourceExhausted
	case errdefs.ErrPrecondition:
		return codes.FailedPrecondition
	case errdefs.ErrBusy:
		return codes.Aborted
	case errdefs.ErrUnavailable:
		return codes.Unavailable
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// toStatus turns a handler's error into a gRPC status error. Errors that are
// already statuses (or wrap one) pass through, unless a Spindle kind wraps
// the status: the outermost kind wins, as everywhere else.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && errdefs.KindOf(err) == nil {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

// reasonOf names the kind of error behind a gRPC code, for the errors
// metric: the errdefs kind that maps to the code (codeOf), in snake case,
// so a dashboard reads "precondition" or "busy" rather than a code number.
func reasonOf(code codes.Code) string {
	switch code {
	case codes.OK:
		return ""
	case codes.InvalidArgument:
		return "invalid_argument"
	case codes.NotFound:
		return "not_found"
	case codes.AlreadyExists:
		return "already_exists"
	case codes.OutOfRange:
		return "out_of_range"
	case codes.ResourceExhausted:
		return "exhausted"
	case codes.FailedPrecondition:
		return "precondition"
	case codes.Aborted:
		return "busy"
	case codes.Unavailable:
		return "unavailable"
	case codes.DeadlineExceeded:
		return "deadline_exceeded"
	case codes.Canceled:
		return "canceled"
	case codes.Unimplemented:
		return "unimplemented"
	}
	return "internal"
}
