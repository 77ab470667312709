package main

import (
	"context"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// watchSource is one kind of object the observer follows with a plain
// list and watch (client-go's informers would pull in more modules than
// this repository has for the one thing needed here: every change, on time).
type watchSource struct {
	what    string
	seen    func(obj any, now time.Time, deleted bool)
	listFn  func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	watchFn func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// list hands every existing object to seen and returns the list's
// resourceVersion, where the watch starts.
func (s watchSource) list(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	l, err := s.listFn(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	items, err := meta.ExtractList(l)
	if err != nil {
		return "", err
	}
	now := time.Now()
	for _, item := range items {
		s.seen(item, now, false)
	}
	lm, err := meta.ListAccessor(l)
	if err != nil {
		return "", err
	}
	return lm.GetResourceVersion(), nil
}

// follow watches from rv until ctx ends, watching again from the last
// version seen when the apiserver closes the watch, and listing again
// when that version has expired.
func (s watchSource) follow(ctx context.Context, rv string) {
	for ctx.Err() == nil {
		w, err := s.watchFn(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "spindle-bench-k8s: watch %s: %v; again in a second\n", s.what, err)
			}
			time.Sleep(time.Second)
			continue
		}
		rv = s.drain(ctx, w, rv)
		w.Stop()
		if rv == "" && ctx.Err() == nil {
			if rv, err = s.list(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "spindle-bench-k8s: list %s: %v; again in a second\n", s.what, err)
				time.Sleep(time.Second)
			}
		}
	}
}

// drain passes a watch's events to seen until it ends, and returns the
// last resourceVersion seen ("" when it expired: list again).
func (s watchSource) drain(ctx context.Context, w watch.Interface, rv string) string {
	for {
		select {
		case <-ctx.Done():
			return rv
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv
			}
			now := time.Now()
			switch ev.Type {
			case watch.Error:
				if status := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(status) || apierrors.IsGone(status) {
					return ""
				}
				return rv
			case watch.Added, watch.Modified, watch.Deleted:
				s.seen(ev.Object, now, ev.Type == watch.Deleted)
			}
			if m, err := meta.Accessor(ev.Object); err == nil {
				rv = m.GetResourceVersion()
			}
		}
	}
}
