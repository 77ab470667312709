package backend

import (
	"errors"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/errdefs"
)

func TestAdmit(t *testing.T) {
	a := func(node string, m AccessMode, ro bool) Attachment {
		return Attachment{NodeID: node, AccessMode: m, ReadOnly: ro}
	}
	tests := []struct {
		name     string
		existing []Attachment
		att      Attachment
		already  bool
		kind     error  // nil: admitted
		mention  string // the error must name this (the holder)
	}{
		{name: "first node", att: a("n1", SingleNodeWriter, false)},
		{name: "repeat is a no-op", existing: []Attachment{a("n1", SingleNodeWriter, false)}, att: a("n1", SingleNodeWriter, false), already: true},
		{name: "same node other readonly", existing: []Attachment{a("n1", SingleNodeWriter, false)}, att: a("n1", SingleNodeWriter, true), kind: errdefs.ErrAlreadyExists, mention: "n1"},
		{name: "same node other mode", existing: []Attachment{a("n1", SingleNodeWriter, false)}, att: a("n1", SingleNodeMultiWriter, false), kind: errdefs.ErrAlreadyExists},
		{name: "single node writer to second node", existing: []Attachment{a("node-a", SingleNodeWriter, false)}, att: a("node-b", SingleNodeWriter, false), kind: errdefs.ErrPrecondition, mention: "node-a"},
		{name: "single node reader to second node", existing: []Attachment{a("node-a", SingleNodeReaderOnly, true)}, att: a("node-b", SingleNodeReaderOnly, true), kind: errdefs.ErrPrecondition, mention: "node-a"},
		{name: "multi reader after single writer", existing: []Attachment{a("node-a", SingleNodeWriter, false)}, att: a("node-b", MultiNodeReaderOnly, true), kind: errdefs.ErrPrecondition, mention: "node-a"},
		{name: "multi reader twice", existing: []Attachment{a("node-a", MultiNodeReaderOnly, true)}, att: a("node-b", MultiNodeReaderOnly, true)},
		{name: "second writer single-writer mode", existing: []Attachment{a("node-a", MultiNodeSingleWriter, false)}, att: a("node-b", MultiNodeSingleWriter, false), kind: errdefs.ErrPrecondition, mention: "node-a"},
		{name: "reader beside single writer", existing: []Attachment{a("node-a", MultiNodeSingleWriter, false)}, att: a("node-b", MultiNodeSingleWriter, true)},
		{name: "multi writer", existing: []Attachment{a("node-a", MultiNodeMultiWriter, false)}, att: a("node-b", MultiNodeMultiWriter, false)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := &Image{ID: "img", Attachments: tt.existing}
			already, err := Admit(img, tt.att)
			if tt.kind == nil {
				if err != nil {
					t.Fatalf("Admit: %v", err)
				}
				if already != tt.already {
					t.Fatalf("already = %t, want %t", already, tt.already)
				}
				return
			}
			if !errors.Is(err, tt.kind) {
				t.Fatalf("Admit error = %v, want kind %v", err, tt.kind)
			}
			if tt.mention != "" && !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %q does not name %q", err, tt.mention)
			}
		})
	}
}

func TestDetached(t *testing.T) {
	atts := []Attachment{{NodeID: "a"}, {NodeID: "b"}}
	out, found := Detached(atts, "a")
	if !found || len(out) != 1 || out[0].NodeID != "b" {
		t.Fatalf("Detached = %v, %t", out, found)
	}
	if len(atts) != 2 || atts[0].NodeID != "a" {
		t.Fatal("Detached must not modify its input")
	}
	if _, found := Detached(atts, "zzz"); found {
		t.Fatal("unknown node reported as found")
	}
}

func TestOneWriterNode(t *testing.T) {
	tests := []struct {
		t       AccessType
		m       AccessMode
		mention []string // empty: allowed
	}{
		{AccessMount, SingleNodeWriter, nil},
		{AccessBlock, SingleNodeMultiWriter, nil},
		{AccessMount, MultiNodeReaderOnly, nil},
		{AccessMount, MultiNodeMultiWriter, []string{"MULTI_NODE_MULTI_WRITER", "the test backend", "one node only"}},
		{AccessBlock, MultiNodeSingleWriter, []string{"MULTI_NODE_SINGLE_WRITER", "test"}},
		{"fuse", SingleNodeWriter, []string{`"fuse"`, "neither mount nor block"}},
		{AccessMount, "EVERYWHERE", []string{`"EVERYWHERE"`}},
	}
	for _, tt := range tests {
		err := OneWriterNode("test", "one node only", tt.t, tt.m)
		if len(tt.mention) == 0 {
			if err != nil {
				t.Errorf("%s %s: %v", tt.t, tt.m, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s %s: error %v, want invalid argument", tt.t, tt.m, err)
			continue
		}
		for _, w := range tt.mention {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %s: %q does not mention %q", tt.t, tt.m, err, w)
			}
		}
	}
}

func TestPublishedTo(t *testing.T) {
	imgs := []*Image{
		{Attachments: []Attachment{{NodeID: "a"}, {NodeID: "b"}}},
		{Attachments: []Attachment{{NodeID: "a"}}},
		{},
	}
	for node, want := range map[string]int64{"a": 2, "b": 1, "c": 0} {
		if got := PublishedTo(imgs, node); got != want {
			t.Errorf("PublishedTo(%s) = %d, want %d", node, got, want)
		}
	}
}

func TestGrantOf(t *testing.T) {
	img := &Image{ID: "pvc-1", Attachments: []Attachment{{NodeID: "a", ReadOnly: true}, {NodeID: "b"}}}
	if a, err := GrantOf(img, "a"); err != nil || !a.ReadOnly || a.NodeID != "a" {
		t.Fatalf("GrantOf(a) = %+v, %v", a, err)
	}
	_, err := GrantOf(img, "c")
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), `"c"`) || !strings.Contains(err.Error(), "pvc-1") {
		t.Fatalf("GrantOf(c) error = %v, want a precondition naming the node and the volume", err)
	}
}
