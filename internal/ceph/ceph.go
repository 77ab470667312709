// Package ceph is Spindle's one client of a Ceph cluster: the RBD images,
// snapshots, clones, trash, image metadata, watchers and locks, the
// manager's background tasks and the RADOS omap records the rbd backend
// keeps, as typed calls of one interface (Client).
//
// Two implementations pass one contract suite (cephtest): the real one
// over librados and librbd (librados.go, cgo through go-ceph; a
// connection per cluster and identity, kept open and shared by every call,
// as ceph-csi does), and an in-memory cluster with failure injection
// (cephfake), on which the rbd backend's logic is tested in seconds
// without root or Ceph. docs/design.md says why librbd and not the rbd CLI.
//
// Every call takes a context and is bounded by the connection's call limit
// (Target.CallLimit); errors carry internal/errdefs kinds derived from
// Ceph's own return codes (ErrNotFound for ENOENT, ...), and Errno gives
// the code itself.
package ceph

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// PoolSpec is a pool, or a RADOS namespace of one.
type PoolSpec struct {
	Pool      string
	Namespace string // "" for the pool's default namespace
}

// String is the rbd CLI's pool spec: "pool" or "pool/namespace".
func (p PoolSpec) String() string {
	if p.Namespace == "" {
		return p.Pool
	}
	return p.Pool + "/" + p.Namespace
}

// Image names image Name in a pool (or namespace of one).
func (p PoolSpec) Image(name string) ImageSpec { return ImageSpec{PoolSpec: p, Name: name} }

// ImageSpec names one RBD image.
type ImageSpec struct {
	PoolSpec
	Name string
}

// String is the rbd CLI's image spec: "pool[/namespace]/image".
func (s ImageSpec) String() string { return s.PoolSpec.String() + "/" + s.Name }

// At is the spec of one of the image's snapshots ("pool/image@snap").
func (s ImageSpec) At(snap string) string { return s.String() + "@" + snap }

// ImageOptions are how a new image (or clone) is made.
type ImageOptions struct {
	Features    []string // "layering", "exclusive-lock", ...
	DataPool    string   // "" for none
	StripeUnit  uint64   // bytes; 0 for the default
	StripeCount uint64   // 0 for the default
	ObjectSize  uint64   // bytes, a power of two; 0 for the default (4 MiB)
}

// ImageInfo is what Ceph says of an image (or of one of its snapshots).
type ImageInfo struct {
	ID       string
	Size     uint64
	Features []string // the image's features by name, Ceph's internal ones included
	Parent   *Parent  // nil when the image is no clone (or is flattened)
	Created  time.Time
}

// ImageHeader is what an image's header says of it, read without opening
// the image (opening a clone opens its parents too).
type ImageHeader struct {
	ID        string
	Size      uint64
	Features  []string // by name, as ImageInfo's
	Created   time.Time
	Metadata  map[string]string
	Snapshots int // in every namespace
}

// Parent is the image and snapshot a clone hangs from. A parent deleted
// while it had clones is in the trash: it has no name to open it by, only
// its ID (Trash is set).
type Parent struct {
	Pool      string
	Namespace string
	Image     string
	ImageID   string
	Snapshot  string // "" when the snapshot is in the trash namespace
	SnapID    uint64
	Trash     bool
}

// SnapNamespace is the namespace of an RBD snapshot.
type SnapNamespace string

// The snapshot namespaces: a user's (rbd snap create), a group
// snapshot's member, one removed while clones hang from it (format 2),
// and mirroring's.
const (
	SnapUser   SnapNamespace = "user"
	SnapGroup  SnapNamespace = "group"
	SnapTrash  SnapNamespace = "trash"
	SnapMirror SnapNamespace = "mirror"
)

// SnapInfo is one snapshot of an image, in any namespace.
type SnapInfo struct {
	ID        uint64
	Name      string
	Namespace SnapNamespace
	Protected bool
	Created   time.Time
}

// Child is a clone of a snapshot; Trash is set for a clone deleted (moved
// to the trash) while it still exists.
type Child struct {
	Pool      string
	Namespace string
	Image     string
	ImageID   string
	Trash     bool
}

// TrashEntry is an image in a pool's trash.
type TrashEntry struct {
	ID   string
	Name string // its name before it was moved
}

// Lock is an advisory lock on an image.
type Lock struct {
	Client string // "client.4567"
	Cookie string
	Addr   string
}

// Inspection is all there is to know of an image before it is removed:
// what DescribeImage says, and what keeps it from going: the clients that
// have it open, its advisory locks and its snapshots (clones hang from
// them).
type Inspection struct {
	Info      ImageInfo
	Metadata  map[string]string
	Watchers  []string // "ip:port/nonce"
	Locks     []Lock
	Snapshots []SnapInfo // in every namespace
}

// TaskAction is a background task of the manager's rbd_support module.
type TaskAction string

// The task actions Spindle adds.
const (
	TaskFlatten     TaskAction = "flatten"
	TaskTrashRemove TaskAction = "trash remove"
)

// Task is one task of the manager's rbd_support module ("ceph rbd task
// list").
type Task struct {
	ID           string
	Action       TaskAction
	Pool         PoolSpec
	Image        string  // the image's name (flatten)
	ImageID      string  // the image's ID (trash remove)
	InProgress   bool    //
	Progress     float64 // 0..1, or -1 when not known
	RetryMessage string  // why it is being retried, if it is
	Message      string  // the manager's description
}

// Release is a Ceph release: 20.2.4 is {20, 2, 4, "tentacle"}.
type Release struct {
	Major, Minor, Patch int
	Name                string
}

func (r Release) String() string {
	s := fmt.Sprintf("%d.%d.%d", r.Major, r.Minor, r.Patch)
	if r.Name != "" {
		s += " (" + r.Name + ")"
	}
	return s
}

// Before reports whether r is an older release than o.
func (r Release) Before(o Release) bool {
	if r.Major != o.Major {
		return r.Major < o.Major
	}
	if r.Minor != o.Minor {
		return r.Minor < o.Minor
	}
	return r.Patch < o.Patch
}

// OldestSupported is the oldest Ceph release Spindle works with: Reef,
// the oldest Rook still ran before it required Squid (Rook 1.19 takes
// 19.2 and 20.2). Older clusters are refused at the first call, naming
// their release and this one.
var OldestSupported = Release{Major: 18, Minor: 2, Name: "reef"}

// Client is one cluster as one cephx identity reaches it. Every call is
// bounded by the connection's call limit and by ctx.
type Client interface {
	// Release is the oldest release among the cluster's monitors.
	Release(ctx context.Context) (Release, error)
	// PoolAvailable is how many more bytes the pool can hold ("ceph df"
	// max_avail); ErrNotFound when there is no such pool.
	PoolAvailable(ctx context.Context, pool string) (int64, error)
	// ManagerClients are the addresses ("ip:port/nonce", as watchers are
	// shown) of the active manager's own clients.
	ManagerClients(ctx context.Context) ([]string, error)
	// Blocklist blocklists a client address ("ceph osd blocklist add").
	Blocklist(ctx context.Context, addr string) error
	// AddFlattenTask has the manager flatten an image in the background;
	// an image without a parent (flattened already) is done. Both task
	// adders answer ErrTasksUnsupported when the manager has no
	// rbd_support module.
	AddFlattenTask(ctx context.Context, image ImageSpec) error
	// AddTrashRemoveTask has the manager remove a trashed image.
	AddTrashRemoveTask(ctx context.Context, pool PoolSpec, imageID string) error
	// Tasks lists the manager's tasks.
	Tasks(ctx context.Context) ([]Task, error)

	// CreateImage creates an image of size bytes.
	CreateImage(ctx context.Context, image ImageSpec, size uint64, opts ImageOptions) error
	// CloneImage makes child a copy-on-write clone (format 2, whatever
	// the cluster's default) of parent@snap; the child may be in another
	// pool or namespace of the cluster.
	CloneImage(ctx context.Context, parent ImageSpec, snap string, child ImageSpec, opts ImageOptions) error
	// StatImage describes an image, or with snap its snapshot snap.
	StatImage(ctx context.Context, image ImageSpec, snap string) (*ImageInfo, error)
	// DescribeImage is StatImage and ImageMetadata of the image's head in
	// one call.
	DescribeImage(ctx context.Context, image ImageSpec) (*ImageInfo, map[string]string, error)
	// ImageHeader reads an image's ID, size, metadata and number of
	// snapshots without opening the image.
	ImageHeader(ctx context.Context, image ImageSpec) (*ImageHeader, error)
	// ResizeImage grows (or shrinks) an image.
	ResizeImage(ctx context.Context, image ImageSpec, size uint64) error
	// RenameImage renames an image within its pool; ErrAlreadyExists when
	// the new name is taken.
	RenameImage(ctx context.Context, image ImageSpec, newName string) error
	// RemoveImage removes an image and its data now (ENOTEMPTY while it
	// has snapshots, EBUSY while it is open).
	RemoveImage(ctx context.Context, image ImageSpec) error
	// ListImages lists the names of a pool's images (not the trash's).
	ListImages(ctx context.Context, pool PoolSpec) ([]string, error)
	// FlattenImage copies a clone's parent data into it and detaches it,
	// now: for the background only.
	FlattenImage(ctx context.Context, image ImageSpec) error

	// ImageMetadata lists an image's metadata.
	ImageMetadata(ctx context.Context, image ImageSpec) (map[string]string, error)
	// ImageMetadataValue is one key's value; ErrNotFound when unset.
	ImageMetadataValue(ctx context.Context, image ImageSpec, key string) (string, error)
	// SetImageMetadata sets each key to its value, and removes each whose
	// value is "" (a key that is not set is removed already), in the
	// order of the keys' names: a call cut short has set a prefix of them.
	SetImageMetadata(ctx context.Context, image ImageSpec, kv map[string]string) error

	// Snapshots lists an image's snapshots in every namespace.
	Snapshots(ctx context.Context, image ImageSpec) ([]SnapInfo, error)
	// SnapshotsOfID lists the snapshots of the image with that ID (one in
	// the trash has no name to open it by).
	SnapshotsOfID(ctx context.Context, pool PoolSpec, imageID string) ([]SnapInfo, error)
	// CreateSnapshot takes a snapshot.
	CreateSnapshot(ctx context.Context, image ImageSpec, snap string) error
	// RemoveSnapshot removes a snapshot; one that clones (format 2) hang
	// from moves to the trash namespace and goes with its last clone.
	RemoveSnapshot(ctx context.Context, image ImageSpec, snap string) error
	// UnprotectSnapshot unprotects a snapshot (one that is not protected
	// is done); EBUSY while clones of format 1 hang from it (format-2
	// clones need no protection).
	UnprotectSnapshot(ctx context.Context, image ImageSpec, snap string) error
	// Children lists the clones of image@snap, those in the trash too.
	Children(ctx context.Context, image ImageSpec, snap string) ([]Child, error)

	// TrashMove moves an image to its pool's trash: its name is free at
	// once, its data stays until the image is removed from the trash.
	TrashMove(ctx context.Context, image ImageSpec) error
	// Trash lists a pool's trash.
	Trash(ctx context.Context, pool PoolSpec) ([]TrashEntry, error)
	// TrashRemove removes a trashed image and its data now: for the
	// background only.
	TrashRemove(ctx context.Context, pool PoolSpec, imageID string) error

	// Watchers lists the addresses of the clients that have the image
	// open ("ip:port/nonce").
	Watchers(ctx context.Context, image ImageSpec) ([]string, error)
	// Locks lists an image's advisory locks.
	Locks(ctx context.Context, image ImageSpec) ([]Lock, error)
	// InspectImage is DescribeImage, Watchers, Locks and Snapshots of an
	// image in one call (one open of the image, where they would open it
	// four times).
	InspectImage(ctx context.Context, image ImageSpec) (*Inspection, error)
	// BreakLock breaks one advisory lock.
	BreakLock(ctx context.Context, image ImageSpec, lock Lock) error

	// SetOmap sets keys of a RADOS object's omap, creating the object.
	SetOmap(ctx context.Context, pool PoolSpec, object string, kv map[string][]byte) error
	// OmapValue is one key's value; ErrNotFound when the object or the
	// key does not exist.
	OmapValue(ctx context.Context, pool PoolSpec, object, key string) ([]byte, error)
	// OmapKeys lists an object's omap keys; none when the object does not
	// exist.
	OmapKeys(ctx context.Context, pool PoolSpec, object string) ([]string, error)
	// RemoveOmapKeys removes keys of an object's omap (a missing object
	// or key is removed already).
	RemoveOmapKeys(ctx context.Context, pool PoolSpec, object string, keys []string) error
}

// Target is one cluster as one identity reaches it.
type Target struct {
	// Monitors are the monitor addresses ("host:port", "v2:host:port");
	// none when ConfigFile names them.
	Monitors []string
	// ConfigFile is a ceph.conf to read first ("" for none).
	ConfigFile string
	// User is the cephx user without "client." ("" for the config
	// file's), Key its base64 key ("" for the config file's keyring).
	User string
	Key  string
	// CallLimit bounds each call (DefaultCallLimit when 0).
	CallLimit time.Duration
}

// DefaultCallLimit bounds every call to the cluster made inside an RPC. A
// stale lock makes a removal wait forever, and an unreachable monitor makes
// a client retry for minutes; neither may hang an RPC. Nothing whose length
// grows with the data (a flatten, removing a large image) runs under it
// but FlattenImage and TrashRemove, which only background work calls.
const DefaultCallLimit = 30 * time.Second

// Dialer gives the Client of a target: the same connection for every call
// with the same target, made at the first.
type Dialer interface {
	Dial(ctx context.Context, t Target) (Client, error)
}

// ErrTasksUnsupported is AddFlattenTask's and AddTrashRemoveTask's answer
// when the cluster's manager has no rbd_support module (before Ceph
// 14.2.3, or the module disabled): the caller runs the work itself.
var ErrTasksUnsupported = errors.New("the Ceph manager has no rbd_support module (no \"ceph rbd task\" commands)")

// Errno is the errno of a Ceph call's failure (positive: 2 for ENOENT),
// or 0 when err carries none.
func Errno(err error) int {
	var e interface{ ErrorCode() int }
	if errors.As(err, &e) {
		if n := e.ErrorCode(); n < 0 {
			return -n
		}
		return e.ErrorCode()
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Errno
	}
	return 0
}

// Error is a failed call: what it was, and the errno Ceph answered. Its
// errdefs kind follows the errno (KindOf).
type Error struct {
	Op    string // "create image kube/csi-vol-…"
	Errno int    // positive
	Msg   string // Ceph's own words, when it gave some
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s", e.Op, errnoText(e.Errno))
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// ErrorCode makes *Error answer Errno like go-ceph's errors.
func (e *Error) ErrorCode() int { return -e.Errno }

// Unwrap gives errdefs.KindOf the kind.
func (e *Error) Unwrap() error { return kindOfErrno(e.Errno) }

// Errnos the package and its callers tell apart.
const (
	EPERM      = 1
	ENOENT     = 2
	EIO        = 5
	EAGAIN     = 11
	EACCES     = 13
	EBUSY      = 16
	EEXIST     = 17
	EXDEV      = 18
	EINVAL     = 22
	ENOSPC     = 28
	ERANGE     = 34
	ENOSYS     = 38
	ENOTEMPTY  = 39
	ENODATA    = 61
	EOPNOTSUPP = 95
	ETIMEDOUT  = 110
	EDQUOT     = 122
	ESHUTDOWN  = 108
)

var errnoNames = map[int]string{
	EPERM: "operation not permitted", ENOENT: "no such file or directory", EIO: "input/output error",
	EAGAIN: "resource temporarily unavailable", EACCES: "permission denied", EBUSY: "device or resource busy",
	EEXIST: "file exists", EXDEV: "invalid cross-device link", EINVAL: "invalid argument",
	ENOSPC: "no space left on device", ERANGE: "numerical result out of range", ENOSYS: "function not implemented",
	ENOTEMPTY: "directory not empty", ENODATA: "no data available", EOPNOTSUPP: "operation not supported",
	ETIMEDOUT: "connection timed out", EDQUOT: "disk quota exceeded", ESHUTDOWN: "cannot send after transport endpoint shutdown",
}

func errnoText(n int) string {
	if s, ok := errnoNames[n]; ok {
		return fmt.Sprintf("(%d) %s", n, s)
	}
	return fmt.Sprintf("errno %d", n)
}

// kindOfErrno maps Ceph's answers to what the driver says: the kinds the
// callers branch on (not found, exists, busy, full) and the rest as
// plain errors.
func kindOfErrno(n int) error {
	switch n {
	case ENOENT:
		return errdefs.ErrNotFound
	case EEXIST:
		return errdefs.ErrAlreadyExists
	case ENOSPC, EDQUOT:
		return errdefs.ErrExhausted
	case EACCES, EPERM:
		return errdefs.ErrPrecondition
	case ETIMEDOUT, ESHUTDOWN:
		return errdefs.ErrUnavailable
	}
	return nil
}

// Errorf makes the *Error of op with errno n (positive).
func Errorf(n int, op string, args ...any) error {
	return &Error{Op: fmt.Sprintf(op, args...), Errno: n}
}

// DeadlineError is a call stopped at the connection's own call limit: not
// refused by the cluster, and not the caller's deadline. It carries no
// errdefs kind: the driver reports it as DEADLINE_EXCEEDED and says whose
// deadline it was.
type DeadlineError struct {
	Op    string
	Limit time.Duration
}

func (e *DeadlineError) Error() string {
	return fmt.Sprintf("%s: stopped by Spindle's own per-call limit of %s (its bound on one call to the Ceph cluster inside an RPC), not refused by the cluster", e.Op, e.Limit)
}

// Unwrap lets errors.Is(err, context.DeadlineExceeded) hold.
func (e *DeadlineError) Unwrap() error { return context.DeadlineExceeded }
