//go:build cgo && ceph

package ceph

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

// The real client: librados and librbd through go-ceph (cgo). One
// connection per target (monitors, config file, identity), made at the
// first call and shared by every later one, as ceph-csi does; closed once
// it has been idle for idleTimeout. A call runs the library function on a
// goroutine of its own and answers at the call's limit even when the
// library has not (librados's own operation timeouts, set to the same
// limit, end it soon after).

// idleTimeout is how long an unused connection stays open.
const idleTimeout = 5 * time.Minute

// NewDialer is the real Dialer.
func NewDialer() Dialer {
	d := &dialer{conns: map[string]*conn{}}
	go d.closeIdle()
	return d
}

type dialer struct {
	mu    sync.Mutex
	conns map[string]*conn
}

// conn is one target's connection and its I/O contexts by pool.
type conn struct {
	target Target
	limit  time.Duration

	mu       sync.Mutex
	rados    *rados.Conn // nil when closed
	ioctx    map[PoolSpec]*rados.IOContext
	inflight int
	lastUse  time.Time
	release  Release
	// attempt is closed when the connection attempt under way ends
	// (nil when none is); attemptErr is how it ended.
	attempt    chan struct{}
	attemptErr error
}

func targetKey(t Target) string {
	h := sha256.New()
	for _, s := range append([]string{t.ConfigFile, t.User, t.Key, t.CallLimit.String()}, t.Monitors...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (d *dialer) Dial(ctx context.Context, t Target) (Client, error) {
	key := targetKey(t)
	d.mu.Lock()
	c := d.conns[key]
	if c == nil {
		limit := t.CallLimit
		if limit <= 0 {
			limit = DefaultCallLimit
		}
		c = &conn{target: t, limit: limit}
		d.conns[key] = c
	}
	d.mu.Unlock()
	// Connect now, so that a wrong key or a cluster below the oldest
	// release is the answer to the first call.
	if err := c.use(ctx); err != nil {
		return nil, err
	}
	c.done()
	return c, nil
}

// closeIdle closes the connections nobody used for idleTimeout.
func (d *dialer) closeIdle() {
	for range time.Tick(idleTimeout / 5) {
		d.mu.Lock()
		for _, c := range d.conns {
			c.mu.Lock()
			// The entry stays: a Client handed out earlier reconnects
			// through it.
			if c.inflight == 0 && time.Since(c.lastUse) > idleTimeout {
				c.closeLocked()
			}
			c.mu.Unlock()
		}
		d.mu.Unlock()
	}
}

func (c *conn) closeLocked() {
	if c.rados == nil {
		return
	}
	for _, io := range c.ioctx {
		io.Destroy()
	}
	c.ioctx = nil
	c.rados.Shutdown()
	c.rados = nil
}

// use marks a call in flight, connecting first when the connection is
// closed: callers that find an attempt under way wait for it (or for
// their own ctx), and share its answer. done ends the call.
func (c *conn) use(ctx context.Context) error {
	for {
		c.mu.Lock()
		c.lastUse = time.Now()
		if c.rados != nil {
			c.inflight++
			c.mu.Unlock()
			return nil
		}
		if c.attempt == nil {
			c.attempt = make(chan struct{})
			go c.connect(c.attempt)
		}
		attempt := c.attempt
		c.mu.Unlock()
		select {
		case <-attempt:
			c.mu.Lock()
			err := c.attemptErr
			c.mu.Unlock()
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("connect to the Ceph cluster as %s: stopped by the request's own deadline or cancellation: %w", c.who(), ctx.Err())
		}
	}
}

// connect makes one attempt to connect, bounded by the call limit (not by
// any one caller), and closes attempt when it is done.
func (c *conn) connect(attempt chan struct{}) {
	r, rel, err := c.dial()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempt, c.attemptErr = nil, err
	if err == nil {
		c.rados, c.ioctx, c.release = r, map[PoolSpec]*rados.IOContext{}, rel
	}
	close(attempt)
}

func (c *conn) done() {
	c.mu.Lock()
	c.inflight--
	c.lastUse = time.Now()
	c.mu.Unlock()
}

// who names the target in messages: its user and monitors, never its key.
func (c *conn) who() string {
	user := c.target.User
	if user == "" {
		user = "the config file's user"
	} else {
		user = "client." + user
	}
	where := strings.Join(c.target.Monitors, ",")
	if where == "" {
		where = "the monitors of " + c.target.ConfigFile
	}
	return user + " at " + where
}

// dial connects a new client to the target and checks the cluster's
// release.
func (c *conn) dial() (*rados.Conn, Release, error) {
	t := c.target
	var r *rados.Conn
	var err error
	if t.User != "" {
		r, err = rados.NewConnWithUser(t.User)
	} else {
		r, err = rados.NewConn()
	}
	if err != nil {
		return nil, Release{}, fmt.Errorf("create a Ceph client for %s: %w", c.who(), err)
	}
	set := func(k, v string) {
		if err == nil {
			if e := r.SetConfigOption(k, v); e != nil {
				err = fmt.Errorf("Ceph client option %s: %w", k, e)
			}
		}
	}
	if t.ConfigFile != "" {
		if e := r.ReadConfigFile(t.ConfigFile); e != nil {
			err = fmt.Errorf("read the Ceph config file %s: %w", t.ConfigFile, e)
		}
	}
	if len(t.Monitors) > 0 {
		set("mon_host", strings.Join(t.Monitors, ","))
	}
	if t.Key != "" {
		// In memory: the key never reaches a file, argv or the log.
		set("key", t.Key)
		set("keyring", "")
	}
	secs := strconv.Itoa(max(1, int(c.limit.Seconds())))
	set("client_mount_timeout", secs)
	set("rados_mon_op_timeout", secs)
	set("rados_osd_op_timeout", secs)
	// No log file, no admin socket: a driver's client leaves nothing on
	// the node's disk.
	set("log_file", "")
	set("admin_socket", "")
	if err != nil {
		r.Shutdown()
		return nil, Release{}, err
	}
	op := "connect to the Ceph cluster as " + c.who()
	connected := make(chan error, 1)
	go func() { connected <- r.Connect() }()
	select {
	case err := <-connected:
		if err != nil {
			r.Shutdown()
			return nil, Release{}, connectError(op, strings.Join(t.Monitors, ","), err)
		}
	case <-time.After(c.limit):
		// The client connecting is abandoned, shut down once it is done.
		go func() {
			<-connected
			r.Shutdown()
		}()
		return nil, Release{}, errdefs.Wrap(errdefs.ErrUnavailable, &DeadlineError{Op: op, Limit: c.limit}, "no monitor of %s answered", strings.Join(t.Monitors, ","))
	}
	rel := clusterRelease(r, c.limit)
	if rel.Major != 0 && rel.Before(OldestSupported) {
		r.Shutdown()
		return nil, Release{}, errdefs.Precondition("the Ceph cluster at %s runs Ceph %s; Spindle needs %d.%d (%s) or newer", strings.Join(t.Monitors, ","), rel, OldestSupported.Major, OldestSupported.Minor, OldestSupported.Name)
	}
	return r, rel, nil
}

// connectError says what a failed connect means.
func connectError(op, monitors string, err error) error {
	switch Errno(err) {
	case EACCES, EPERM:
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: the cluster refused the cephx key (wrong key, or no such user)", op)
	case ETIMEDOUT:
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "no monitor of %s answered: %s", monitors, op)
	case EINVAL:
		// Before it asks a monitor anything, the client decodes its key:
		// a string that is no key, or a key of a cipher the client's
		// release does not know (aes256k before Ceph 20), ends here.
		return errdefs.Wrap(errdefs.ErrPrecondition, err, "%s: the Ceph client cannot read the cephx key (not a key, or of a cipher this client does not know: aes256k keys, Tentacle's default, need a Ceph 20 client)", op)
	}
	return wrap(op, err)
}

// call is one call of the client: connected, in flight until fn returns
// (even after the caller stopped waiting), errors wrapped.
func (c *conn) call(ctx context.Context, op string, fn func(c *conn) error) error {
	if err := c.use(ctx); err != nil {
		return err
	}
	callCtx, cancel := context.WithTimeout(ctx, c.limit)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer c.done()
		done <- fn(c)
	}()
	select {
	case err := <-done:
		return wrap(op, err)
	case <-callCtx.Done():
		if ctx.Err() != nil {
			return fmt.Errorf("%s: stopped by the request's own deadline or cancellation: %w", op, ctx.Err())
		}
		return &DeadlineError{Op: op, Limit: c.limit}
	}
}

// wrap gives a library error its *Error (errno and kind).
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) || errdefs.KindOf(err) != nil {
		return err
	}
	if n := Errno(err); n != 0 {
		return &Error{Op: op, Errno: n}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// ioctxOf is the I/O context of a pool (namespace), opened once.
func (c *conn) ioctxOf(p PoolSpec) (*rados.IOContext, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if io, ok := c.ioctx[p]; ok {
		return io, nil
	}
	io, err := c.rados.OpenIOContext(p.Pool)
	if err != nil {
		return nil, err
	}
	io.SetNamespace(p.Namespace)
	c.ioctx[p] = io
	return io, nil
}

// withImage opens an image (read-only unless rw; at snap when given) for
// fn.
func (c *conn) withImage(spec ImageSpec, snap string, rw bool, fn func(*rbd.Image) error) error {
	io, err := c.ioctxOf(spec.PoolSpec)
	if err != nil {
		return err
	}
	var img *rbd.Image
	if rw {
		img, err = rbd.OpenImage(io, spec.Name, snap)
	} else {
		img, err = rbd.OpenImageReadOnly(io, spec.Name, snap)
	}
	if err != nil {
		return err
	}
	defer img.Close()
	return fn(img)
}

// command runs a monitor (or, with mgr, manager) command and decodes its
// JSON answer into out (when not nil).
func (c *conn) command(mgr bool, out any, args map[string]any) error {
	return command(c.rados, mgr, out, args)
}

func command(r *rados.Conn, mgr bool, out any, args map[string]any) error {
	args["format"] = "json"
	b, err := json.Marshal(args)
	if err != nil {
		return err
	}
	var res []byte
	var status string
	if mgr {
		res, status, err = r.MgrCommand([][]byte{b})
	} else {
		res, status, err = r.MonCommand(b)
	}
	if err != nil {
		if n := Errno(err); n != 0 {
			return &Error{Op: fmt.Sprint(args["prefix"]), Errno: n, Msg: strings.TrimSpace(status)}
		}
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(res, out); err != nil {
		return fmt.Errorf("%s: cannot parse the cluster's JSON answer %.200q: %w", args["prefix"], res, err)
	}
	return nil
}

// versionRe reads "ceph version 20.2.4 (hash) tentacle (stable ...)".
var versionRe = regexp.MustCompile(`ceph version (\d+)\.(\d+)\.(\d+)\S* \([0-9a-f]+\) (\w+)`)

func parseRelease(s string) (Release, bool) {
	m := versionRe.FindStringSubmatch(s)
	if m == nil {
		return Release{}, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	patch, _ := strconv.Atoi(m[3])
	return Release{Major: major, Minor: minor, Patch: patch, Name: m[4]}, true
}

// clusterRelease is the oldest monitor's release ("versions"); a user
// whose caps do not allow that command gets the monitor map's minimum
// release ("mon dump"); a cluster that answers neither in time is not
// judged (Release{}).
func clusterRelease(r *rados.Conn, limit time.Duration) Release {
	ask := func(out any, args map[string]any) error {
		done := make(chan error, 1)
		go func() { done <- command(r, false, out, args) }()
		select {
		case err := <-done:
			return err
		case <-time.After(limit):
			return context.DeadlineExceeded
		}
	}
	var versions map[string]map[string]int
	if err := ask(&versions, map[string]any{"prefix": "versions"}); err == nil {
		var oldest Release
		for v := range versions["mon"] {
			if rel, ok := parseRelease(v); ok && (oldest.Major == 0 || rel.Before(oldest)) {
				oldest = rel
			}
		}
		return oldest
	}
	var dump struct {
		MinMonRelease     int    `json:"min_mon_release"`
		MinMonReleaseName string `json:"min_mon_release_name"`
	}
	if err := ask(&dump, map[string]any{"prefix": "mon dump"}); err != nil {
		return Release{}
	}
	return Release{Major: dump.MinMonRelease, Name: dump.MinMonReleaseName}
}

func (c *conn) Release(ctx context.Context) (Release, error) {
	if err := c.use(ctx); err != nil {
		return Release{}, err
	}
	defer c.done()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.release, nil
}

func (c *conn) PoolAvailable(ctx context.Context, pool string) (int64, error) {
	var df struct {
		Pools []struct {
			Name  string `json:"name"`
			Stats struct {
				MaxAvail int64 `json:"max_avail"`
			} `json:"stats"`
		} `json:"pools"`
	}
	err := c.call(ctx, "ceph df", func(c *conn) error { return c.command(false, &df, map[string]any{"prefix": "df"}) })
	if err != nil {
		return 0, err
	}
	for _, p := range df.Pools {
		if p.Name == pool {
			return p.Stats.MaxAvail, nil
		}
	}
	return 0, errdefs.NotFound("ceph df lists no pool %s", pool)
}

func (c *conn) ManagerClients(ctx context.Context) ([]string, error) {
	var d struct {
		ActiveClients []struct {
			Addrvec []struct {
				Addr  string `json:"addr"`
				Nonce uint64 `json:"nonce"`
			} `json:"addrvec"`
		} `json:"active_clients"`
	}
	err := c.call(ctx, "ceph mgr dump", func(c *conn) error { return c.command(false, &d, map[string]any{"prefix": "mgr dump"}) })
	if err != nil {
		return nil, err
	}
	var out []string
	for _, cl := range d.ActiveClients {
		for _, a := range cl.Addrvec {
			out = append(out, a.Addr+"/"+strconv.FormatUint(a.Nonce, 10))
		}
	}
	return out, nil
}

func (c *conn) Blocklist(ctx context.Context, addr string) error {
	return c.call(ctx, "ceph osd blocklist add "+addr, func(c *conn) error {
		return c.command(false, nil, map[string]any{"prefix": "osd blocklist", "blocklistop": "add", "addr": addr})
	})
}

// taskError says ErrTasksUnsupported where the manager has no rbd_support
// module: EINVAL "no valid command found" / "No handler", or EOPNOTSUPP
// for a disabled module.
func taskError(err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	switch {
	case e.Errno == EOPNOTSUPP,
		e.Errno == EINVAL && (strings.Contains(e.Msg, "no valid command found") || strings.Contains(e.Msg, "No handler")):
		return fmt.Errorf("%w: %v", ErrTasksUnsupported, err)
	}
	return err
}

func (c *conn) AddFlattenTask(ctx context.Context, image ImageSpec) error {
	err := taskError(c.call(ctx, "ceph rbd task add flatten "+image.String(), func(c *conn) error {
		return c.command(true, nil, map[string]any{"prefix": "rbd task add flatten", "image_spec": image.String()})
	}))
	// ENOENT "Image … does not have a parent": flattened already.
	var e *Error
	if errors.As(err, &e) && e.Errno == ENOENT && strings.Contains(e.Msg, "does not have a parent") {
		return nil
	}
	return err
}

func (c *conn) AddTrashRemoveTask(ctx context.Context, pool PoolSpec, imageID string) error {
	spec := pool.Image(imageID).String()
	return taskError(c.call(ctx, "ceph rbd task add trash remove "+spec, func(c *conn) error {
		return c.command(true, nil, map[string]any{"prefix": "rbd task add trash remove", "image_id_spec": spec})
	}))
}

// mgrTask is one entry of "rbd task list".
type mgrTask struct {
	ID      string `json:"id"`
	Message string `json:"message"`
	Refs    struct {
		Action        string `json:"action"`
		PoolName      string `json:"pool_name"`
		PoolNamespace string `json:"pool_namespace"`
		ImageName     string `json:"image_name"`
		ImageID       string `json:"image_id"`
	} `json:"refs"`
	InProgress   bool     `json:"in_progress"`
	Progress     *float64 `json:"progress,omitempty"`
	RetryMessage string   `json:"retry_message,omitempty"`
}

func (c *conn) Tasks(ctx context.Context) ([]Task, error) {
	var list []mgrTask
	err := c.call(ctx, "ceph rbd task list", func(c *conn) error {
		return c.command(true, &list, map[string]any{"prefix": "rbd task list"})
	})
	if err != nil {
		return nil, taskError(err)
	}
	out := make([]Task, 0, len(list))
	for _, t := range list {
		task := Task{ID: t.ID, Action: TaskAction(t.Refs.Action), Pool: PoolSpec{Pool: t.Refs.PoolName, Namespace: t.Refs.PoolNamespace},
			Image: t.Refs.ImageName, ImageID: t.Refs.ImageID, InProgress: t.InProgress, Progress: -1,
			RetryMessage: t.RetryMessage, Message: t.Message}
		if t.Progress != nil {
			task.Progress = *t.Progress
		}
		out = append(out, task)
	}
	return out, nil
}

// imageOptions builds librbd's options; the caller destroys them.
func imageOptions(o ImageOptions, clone bool) (*rbd.ImageOptions, error) {
	rio := rbd.NewRbdImageOptions()
	var err error
	set := func(opt rbd.ImageOption, v uint64) {
		if err == nil {
			err = rio.SetUint64(opt, v)
		}
	}
	if len(o.Features) > 0 {
		set(rbd.ImageOptionFeatures, uint64(rbd.FeatureSetFromNames(o.Features)))
	}
	if o.StripeUnit > 0 {
		set(rbd.ImageOptionStripeUnit, o.StripeUnit)
	}
	if o.StripeCount > 0 {
		set(rbd.ImageOptionStripeCount, o.StripeCount)
	}
	if o.ObjectSize > 0 {
		set(rbd.ImageOptionOrder, uint64(bits.TrailingZeros64(o.ObjectSize)))
	}
	if clone {
		// Format 2 whatever the cluster's rbd_default_clone_format says:
		// no protection, and a snapshot removed under clones waits in the
		// trash namespace.
		set(rbd.ImageOptionCloneFormat, 2)
	}
	if err == nil && o.DataPool != "" {
		err = rio.SetString(rbd.ImageOptionDataPool, o.DataPool)
	}
	if err != nil {
		rio.Destroy()
		return nil, err
	}
	return rio, nil
}

func (c *conn) CreateImage(ctx context.Context, image ImageSpec, size uint64, opts ImageOptions) error {
	return c.call(ctx, "create image "+image.String(), func(c *conn) error {
		io, err := c.ioctxOf(image.PoolSpec)
		if err != nil {
			return err
		}
		rio, err := imageOptions(opts, false)
		if err != nil {
			return err
		}
		defer rio.Destroy()
		return rbd.CreateImage(io, image.Name, size, rio)
	})
}

func (c *conn) CloneImage(ctx context.Context, parent ImageSpec, snap string, child ImageSpec, opts ImageOptions) error {
	return c.call(ctx, "clone "+parent.At(snap)+" to "+child.String(), func(c *conn) error {
		pio, err := c.ioctxOf(parent.PoolSpec)
		if err != nil {
			return err
		}
		cio, err := c.ioctxOf(child.PoolSpec)
		if err != nil {
			return err
		}
		rio, err := imageOptions(opts, true)
		if err != nil {
			return err
		}
		defer rio.Destroy()
		return rbd.CloneImage(pio, parent.Name, snap, cio, child.Name, rio)
	})
}

// stat reads an open image's info.
func stat(img *rbd.Image) (*ImageInfo, error) {
	info := &ImageInfo{}
	var err error
	if info.ID, err = img.GetId(); err != nil {
		return nil, err
	}
	if info.Size, err = img.GetSize(); err != nil {
		return nil, err
	}
	features, err := img.GetFeatures()
	if err != nil {
		return nil, err
	}
	fs := rbd.FeatureSet(features)
	info.Features = fs.Names()
	slices.Sort(info.Features)
	if ts, err := img.GetCreateTimestamp(); err == nil {
		info.Created = time.Unix(ts.Sec, ts.Nsec)
	}
	p, err := img.GetParent()
	switch {
	case errors.Is(err, rbd.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		info.Parent = &Parent{Pool: p.Image.PoolName, Namespace: p.Image.PoolNamespace, Image: p.Image.ImageName,
			ImageID: p.Image.ImageID, Trash: p.Image.Trash, Snapshot: p.Snap.SnapName, SnapID: p.Snap.ID}
	}
	return info, nil
}

func (c *conn) StatImage(ctx context.Context, image ImageSpec, snap string) (*ImageInfo, error) {
	op := "stat image " + image.String()
	if snap != "" {
		op = "stat snapshot " + image.At(snap)
	}
	var info *ImageInfo
	err := c.call(ctx, op, func(c *conn) error {
		return c.withImage(image, snap, false, func(img *rbd.Image) (err error) {
			info, err = stat(img)
			return err
		})
	})
	return info, err
}

// DescribeImage reads an image's info and metadata with one open.
func (c *conn) DescribeImage(ctx context.Context, image ImageSpec) (*ImageInfo, map[string]string, error) {
	var info *ImageInfo
	var meta map[string]string
	err := c.call(ctx, "describe image "+image.String(), func(c *conn) error {
		return c.withImage(image, "", false, func(img *rbd.Image) (err error) {
			if info, err = stat(img); err != nil {
				return err
			}
			meta, err = img.ListMetadata()
			return err
		})
	})
	if meta == nil && err == nil {
		meta = map[string]string{}
	}
	return info, meta, err
}

func (c *conn) ImageHeader(ctx context.Context, image ImageSpec) (*ImageHeader, error) {
	h := &ImageHeader{}
	err := c.call(ctx, "read the header of "+image.String(), func(c *conn) error {
		io, header, err := c.header(image)
		if err != nil {
			return err
		}
		if header == "" {
			return c.withImage(image, "", false, func(img *rbd.Image) (err error) {
				info, err := stat(img)
				if err != nil {
					return err
				}
				h.ID, h.Size, h.Features, h.Created = info.ID, info.Size, info.Features, info.Created
				snaps, err := snapshots(img)
				if err != nil {
					return err
				}
				h.Snapshots = len(snaps)
				h.Metadata, err = img.ListMetadata()
				return err
			})
		}
		h.ID = strings.TrimPrefix(header, headerObjectPrefix)
		op := rados.CreateReadOp()
		defer op.Release()
		sizeStep := op.Exec("rbd", "get_size", binary.LittleEndian.AppendUint64(nil, headSnapID))
		featureStep := op.Exec("rbd", "get_features", binary.LittleEndian.AppendUint64(nil, headSnapID))
		snapStep := op.Exec("rbd", "get_snapcontext", nil)
		createdStep := op.Exec("rbd", "get_create_timestamp", nil)
		if err := op.Operate(io, header, rados.OperationNoFlag); err != nil {
			return err
		}
		out, err := sizeStep.Bytes()
		if err == nil {
			h.Size, err = decodeSize(out)
		}
		if err != nil {
			return fmt.Errorf("size of %s: %w", header, err)
		}
		out, err = featureStep.Bytes()
		if err == nil {
			var features uint64
			if features, err = decodeFeatures(out); err == nil {
				fs := rbd.FeatureSet(features)
				h.Features = fs.Names()
				slices.Sort(h.Features)
			}
		}
		if err != nil {
			return fmt.Errorf("features of %s: %w", header, err)
		}
		out, err = snapStep.Bytes()
		if err == nil {
			h.Snapshots, err = decodeSnapCount(out)
		}
		if err != nil {
			return fmt.Errorf("snapshots of %s: %w", header, err)
		}
		out, err = createdStep.Bytes()
		if err == nil {
			h.Created, err = decodeTime(out)
		}
		if err != nil {
			return fmt.Errorf("creation time of %s: %w", header, err)
		}
		h.Metadata, err = listMetadata(io, header)
		return err
	})
	if err != nil {
		return nil, err
	}
	if h.Metadata == nil {
		h.Metadata = map[string]string{}
	}
	return h, nil
}

func (c *conn) ResizeImage(ctx context.Context, image ImageSpec, size uint64) error {
	return c.call(ctx, "resize image "+image.String(), func(c *conn) error {
		return c.withImage(image, "", true, func(img *rbd.Image) error { return img.Resize(size) })
	})
}

func (c *conn) RenameImage(ctx context.Context, image ImageSpec, newName string) error {
	return c.call(ctx, "rename image "+image.String()+" to "+newName, func(c *conn) error {
		io, err := c.ioctxOf(image.PoolSpec)
		if err != nil {
			return err
		}
		return rbd.GetImage(io, image.Name).Rename(newName)
	})
}

func (c *conn) RemoveImage(ctx context.Context, image ImageSpec) error {
	return c.call(ctx, "remove image "+image.String(), func(c *conn) error {
		io, err := c.ioctxOf(image.PoolSpec)
		if err != nil {
			return err
		}
		return rbd.RemoveImage(io, image.Name)
	})
}

func (c *conn) ListImages(ctx context.Context, pool PoolSpec) ([]string, error) {
	var names []string
	err := c.call(ctx, "list images of "+pool.String(), func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		names, err = rbd.GetImageNames(io)
		return err
	})
	slices.Sort(names)
	return names, err
}

func (c *conn) FlattenImage(ctx context.Context, image ImageSpec) error {
	return c.call(ctx, "flatten image "+image.String(), func(c *conn) error {
		return c.withImage(image, "", true, func(img *rbd.Image) error { return img.Flatten() })
	})
}

func (c *conn) ImageMetadata(ctx context.Context, image ImageSpec) (map[string]string, error) {
	var meta map[string]string
	err := c.call(ctx, "list metadata of "+image.String(), func(c *conn) error {
		io, header, err := c.header(image)
		if err != nil {
			return err
		}
		if header != "" {
			meta, err = listMetadata(io, header)
			return err
		}
		return c.withImage(image, "", false, func(img *rbd.Image) (err error) {
			meta, err = img.ListMetadata()
			return err
		})
	})
	if meta == nil && err == nil {
		meta = map[string]string{}
	}
	return meta, err
}

func (c *conn) ImageMetadataValue(ctx context.Context, image ImageSpec, key string) (string, error) {
	var v string
	err := c.call(ctx, "get metadata "+key+" of "+image.String(), func(c *conn) error {
		io, header, err := c.header(image)
		if err != nil {
			return err
		}
		if header != "" {
			op := rados.CreateReadOp()
			defer op.Release()
			step := op.Exec("rbd", "metadata_get", appendString(nil, key))
			if err := op.Operate(io, header, rados.OperationNoFlag); err != nil {
				return err
			}
			out, err := step.Bytes()
			if err == nil {
				v, _, err = decodeString(out)
			}
			return err
		}
		return c.withImage(image, "", false, func(img *rbd.Image) (err error) {
			v, err = img.GetMetadata(key)
			return err
		})
	})
	return v, err
}

func (c *conn) SetImageMetadata(ctx context.Context, image ImageSpec, kv map[string]string) error {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return c.call(ctx, "set metadata of "+image.String(), func(c *conn) error {
		if directMetadata(keys) {
			// A key removed by another client between the list and the
			// write fails the write whole: it is made again.
			for attempt := 0; ; attempt++ {
				done, err := c.setMetadataDirect(image, kv)
				if done && (Errno(err) != ENOENT || attempt == 2) {
					return err
				}
				if !done {
					break
				}
			}
		}
		return c.withImage(image, "", true, func(img *rbd.Image) error {
			for _, k := range keys {
				if v := kv[k]; v != "" {
					if err := img.SetMetadata(k, v); err != nil {
						return fmt.Errorf("set %s: %w", k, err)
					}
				} else if err := img.RemoveMetadata(k); err != nil && Errno(err) != ENOENT {
					return fmt.Errorf("remove %s: %w", k, err)
				}
			}
			return nil
		})
	})
}

// header is the I/O context and header object of a format-2 image, or ""
// for the header when the image has no ID object (format 1, or no such
// image: opening it through librbd tells which).
func (c *conn) header(image ImageSpec) (*rados.IOContext, string, error) {
	io, err := c.ioctxOf(image.PoolSpec)
	if err != nil {
		return nil, "", err
	}
	op := rados.CreateReadOp()
	defer op.Release()
	step := op.Exec("rbd", "get_id", nil)
	err = op.Operate(io, idObjectPrefix+image.Name, rados.OperationNoFlag)
	if Errno(err) == ENOENT {
		return io, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	out, err := step.Bytes()
	if err != nil {
		return nil, "", err
	}
	id, _, err := decodeString(out)
	if err != nil {
		return nil, "", fmt.Errorf("ID of image %s: %w", image, err)
	}
	return io, headerObjectPrefix + id, nil
}

// listMetadata lists all metadata of the image whose header object that
// is, a page at a time.
func listMetadata(io *rados.IOContext, header string) (map[string]string, error) {
	const page = 256
	all := map[string]string{}
	after := ""
	for {
		op := rados.CreateReadOp()
		step := op.Exec("rbd", "metadata_list", encodeListArgs(after, page))
		err := op.Operate(io, header, rados.OperationNoFlag)
		var out []byte
		if err == nil {
			out, err = step.Bytes()
		}
		op.Release()
		if err != nil {
			return nil, err
		}
		m, err := decodeMap(out)
		if err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", header, err)
		}
		for k, v := range m {
			all[k] = v
			after = max(after, k)
		}
		if len(m) < page {
			return all, nil
		}
	}
}

// setMetadataDirect sets and removes the keys with one write to the
// image's header object; done is false when the image has none to write
// to (SetImageMetadata then opens it).
func (c *conn) setMetadataDirect(image ImageSpec, kv map[string]string) (done bool, err error) {
	io, header, err := c.header(image)
	if err != nil || header == "" {
		return err != nil, err
	}
	set := map[string]string{}
	var remove []string
	for k, v := range kv {
		if v != "" {
			set[k] = v
		} else {
			remove = append(remove, k)
		}
	}
	if len(remove) > 0 {
		// metadata_remove fails on a key that is not there.
		present, err := listMetadata(io, header)
		if err != nil {
			return true, err
		}
		remove = slices.DeleteFunc(remove, func(k string) bool { _, ok := present[k]; return !ok })
		slices.Sort(remove)
	}
	if len(set) == 0 && len(remove) == 0 {
		return true, nil
	}
	op := rados.CreateWriteOp()
	defer op.Release()
	op.AssertExists() // an image removed meanwhile gets no stray header
	if len(set) > 0 {
		op.Exec("rbd", "metadata_set", encodeMap(set))
	}
	for _, k := range remove {
		op.Exec("rbd", "metadata_remove", appendString(nil, k))
	}
	return true, op.Operate(io, header, rados.OperationNoFlag)
}

var snapNamespaces = map[rbd.SnapNamespaceType]SnapNamespace{
	rbd.SnapNamespaceTypeUser: SnapUser, rbd.SnapNamespaceTypeGroup: SnapGroup, rbd.SnapNamespaceTypeTrash: SnapTrash,
}

// snapshots lists an open image's snapshots, in every namespace.
func snapshots(img *rbd.Image) ([]SnapInfo, error) {
	list, err := img.GetSnapshotNames()
	if err != nil {
		return nil, err
	}
	out := make([]SnapInfo, 0, len(list))
	for _, s := range list {
		info := SnapInfo{ID: s.Id, Name: s.Name, Namespace: SnapMirror}
		nt, err := img.GetSnapNamespaceType(s.Id)
		if err != nil {
			return nil, err
		}
		if ns, ok := snapNamespaces[nt]; ok {
			info.Namespace = ns
		}
		if info.Namespace == SnapUser {
			if info.Protected, err = img.GetSnapshot(s.Name).IsProtected(); err != nil {
				return nil, err
			}
		}
		if ts, err := img.GetSnapTimestamp(s.Id); err == nil {
			info.Created = time.Unix(ts.Sec, ts.Nsec)
		}
		out = append(out, info)
	}
	return out, nil
}

func (c *conn) Snapshots(ctx context.Context, image ImageSpec) ([]SnapInfo, error) {
	var out []SnapInfo
	err := c.call(ctx, "list snapshots of "+image.String(), func(c *conn) error {
		return c.withImage(image, "", false, func(img *rbd.Image) (err error) {
			out, err = snapshots(img)
			return err
		})
	})
	return out, err
}

func (c *conn) SnapshotsOfID(ctx context.Context, pool PoolSpec, imageID string) ([]SnapInfo, error) {
	var out []SnapInfo
	err := c.call(ctx, "list snapshots of image ID "+pool.Image(imageID).String(), func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		img, err := rbd.OpenImageByIdReadOnly(io, imageID, rbd.NoSnapshot)
		if err != nil {
			return err
		}
		defer img.Close()
		out, err = snapshots(img)
		return err
	})
	return out, err
}

func (c *conn) CreateSnapshot(ctx context.Context, image ImageSpec, snap string) error {
	return c.call(ctx, "create snapshot "+image.At(snap), func(c *conn) error {
		return c.withImage(image, "", true, func(img *rbd.Image) error {
			_, err := img.CreateSnapshot(snap)
			return err
		})
	})
}

func (c *conn) RemoveSnapshot(ctx context.Context, image ImageSpec, snap string) error {
	return c.call(ctx, "remove snapshot "+image.At(snap), func(c *conn) error {
		return c.withImage(image, "", true, func(img *rbd.Image) error { return img.GetSnapshot(snap).Remove() })
	})
}

func (c *conn) UnprotectSnapshot(ctx context.Context, image ImageSpec, snap string) error {
	return c.call(ctx, "unprotect snapshot "+image.At(snap), func(c *conn) error {
		return c.withImage(image, "", true, func(img *rbd.Image) error {
			s := img.GetSnapshot(snap)
			if p, err := s.IsProtected(); err != nil || !p {
				return err
			}
			return s.Unprotect()
		})
	})
}

func (c *conn) Children(ctx context.Context, image ImageSpec, snap string) ([]Child, error) {
	var out []Child
	err := c.call(ctx, "list children of "+image.At(snap), func(c *conn) error {
		return c.withImage(image, snap, false, func(img *rbd.Image) error {
			specs, err := img.ListChildrenAttributes()
			if err != nil {
				return err
			}
			for _, s := range specs {
				out = append(out, Child{Pool: s.PoolName, Namespace: s.PoolNamespace, Image: s.ImageName, ImageID: s.ImageID, Trash: s.Trash})
			}
			return nil
		})
	})
	return out, err
}

func (c *conn) TrashMove(ctx context.Context, image ImageSpec) error {
	return c.call(ctx, "move image "+image.String()+" to the trash", func(c *conn) error {
		io, err := c.ioctxOf(image.PoolSpec)
		if err != nil {
			return err
		}
		return rbd.GetImage(io, image.Name).Trash(0)
	})
}

func (c *conn) Trash(ctx context.Context, pool PoolSpec) ([]TrashEntry, error) {
	var out []TrashEntry
	err := c.call(ctx, "list the trash of "+pool.String(), func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		list, err := rbd.GetTrashList(io)
		for _, e := range list {
			out = append(out, TrashEntry{ID: e.Id, Name: e.Name})
		}
		return err
	})
	return out, err
}

func (c *conn) TrashRemove(ctx context.Context, pool PoolSpec, imageID string) error {
	return c.call(ctx, "remove trashed image "+pool.Image(imageID).String(), func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		return rbd.TrashRemove(io, imageID, true)
	})
}

func (c *conn) Watchers(ctx context.Context, image ImageSpec) ([]string, error) {
	var out []string
	err := c.call(ctx, "list watchers of "+image.String(), func(c *conn) error {
		return c.withImage(image, "", false, func(img *rbd.Image) error {
			ws, err := img.ListWatchers()
			for _, w := range ws {
				out = append(out, w.Addr)
			}
			return err
		})
	})
	return out, err
}

func (c *conn) Locks(ctx context.Context, image ImageSpec) ([]Lock, error) {
	var out []Lock
	err := c.call(ctx, "list locks of "+image.String(), func(c *conn) error {
		return c.withImage(image, "", false, func(img *rbd.Image) error {
			_, lockers, err := img.ListLockers()
			for _, l := range lockers {
				out = append(out, Lock{Client: l.Client, Cookie: l.Cookie, Addr: l.Addr})
			}
			return err
		})
	})
	return out, err
}

func (c *conn) InspectImage(ctx context.Context, image ImageSpec) (*Inspection, error) {
	in := &Inspection{}
	err := c.call(ctx, "inspect image "+image.String(), func(c *conn) error {
		return c.withImage(image, "", false, func(img *rbd.Image) error {
			info, err := stat(img)
			if err != nil {
				return err
			}
			in.Info = *info
			if in.Metadata, err = img.ListMetadata(); err != nil {
				return err
			}
			ws, err := img.ListWatchers()
			if err != nil {
				return err
			}
			for _, w := range ws {
				in.Watchers = append(in.Watchers, w.Addr)
			}
			_, lockers, err := img.ListLockers()
			if err != nil {
				return err
			}
			for _, l := range lockers {
				in.Locks = append(in.Locks, Lock{Client: l.Client, Cookie: l.Cookie, Addr: l.Addr})
			}
			in.Snapshots, err = snapshots(img)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	if in.Metadata == nil {
		in.Metadata = map[string]string{}
	}
	return in, nil
}

func (c *conn) BreakLock(ctx context.Context, image ImageSpec, lock Lock) error {
	return c.call(ctx, "break lock "+lock.Cookie+" of "+image.String(), func(c *conn) error {
		return c.withImage(image, "", true, func(img *rbd.Image) error { return img.BreakLock(lock.Client, lock.Cookie) })
	})
}

func (c *conn) SetOmap(ctx context.Context, pool PoolSpec, object string, kv map[string][]byte) error {
	return c.call(ctx, "set omap keys of "+pool.String()+"/"+object, func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		return io.SetOmap(object, kv)
	})
}

func (c *conn) OmapValue(ctx context.Context, pool PoolSpec, object, key string) ([]byte, error) {
	var v []byte
	op := "read omap key " + key + " of " + pool.String() + "/" + object
	err := c.call(ctx, op, func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		rop := rados.CreateReadOp()
		defer rop.Release()
		step := rop.GetOmapValuesByKeys([]string{key})
		if err := rop.Operate(io, object, rados.OperationNoFlag); err != nil {
			return err
		}
		for {
			kv, err := step.Next()
			if err != nil {
				return err
			}
			if kv == nil {
				return &Error{Op: op, Errno: ENOENT, Msg: "no such key"}
			}
			if kv.Key == key {
				v = kv.Value
				return nil
			}
		}
	})
	return v, err
}

func (c *conn) OmapKeys(ctx context.Context, pool PoolSpec, object string) ([]string, error) {
	var keys []string
	err := c.call(ctx, "list omap keys of "+pool.String()+"/"+object, func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		err = io.ListOmapValues(object, "", "", 1<<20, func(key string, _ []byte) { keys = append(keys, key) })
		if Errno(err) == ENOENT {
			return nil // no object: no keys
		}
		return err
	})
	slices.Sort(keys)
	return keys, err
}

func (c *conn) RemoveOmapKeys(ctx context.Context, pool PoolSpec, object string, keys []string) error {
	return c.call(ctx, "remove omap keys of "+pool.String()+"/"+object, func(c *conn) error {
		io, err := c.ioctxOf(pool)
		if err != nil {
			return err
		}
		if err := io.RmOmapKeys(object, keys); Errno(err) != ENOENT {
			return err
		}
		return nil
	})
}

var _ Client = (*conn)(nil)
