package node

import (
	"context"
	"strings"
	"testing"

	"github.com/spindle-csi/spindle/internal/command/commandtest"
	"github.com/spindle-csi/spindle/internal/errdefs"
)

// cryptsetup's command lines, with the passphrase on stdin only, and its
// answers (as cryptsetup 2.6 prints them) turned into the node's errors.
func TestLUKSCommands(t *testing.T) {
	const dev, name = "/dev/loop3", "spindle-0123"
	key := string(testPassphrase)
	d, script := scriptedHost(t,
		commandtest.Expect("cryptsetup", append(luksFormatArgs, dev)...).Reads(key),
		commandtest.Expect("cryptsetup", "open", "--type", "luks2", "--disable-keyring", "--key-file=-", dev, name).Reads(key),
		commandtest.Expect("cryptsetup", "open", "--type", "luks2", "--disable-keyring", "--key-file=-", "--readonly", dev, name).Reads("wrong").
			Exits(2, "No key available with this passphrase."),
		commandtest.Expect("cryptsetup", "resize", name).Reads(""),
		commandtest.Expect("cryptsetup", "open", "--test-passphrase", "--type", "luks2", "--key-file=-", dev).Reads("wrong").
			Exits(2, "No key available with this passphrase."),
		commandtest.Expect("cryptsetup", "luksRemoveKey", "--key-file=-", dev).Reads("wrong").
			Exits(2, "No key available with this passphrase."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name).Exits(5, "Device "+name+" is still in use."),
		commandtest.Expect("cryptsetup", "close", name),
		commandtest.Expect("cryptsetup", "close", name).Exits(4, "Device "+name+" is not active."),
	)
	ctx := context.Background()
	if err := d.LUKSFormat(ctx, dev, testPassphrase); err != nil {
		t.Fatal(err)
	}
	if err := d.LUKSOpen(ctx, dev, name, testPassphrase, false); err != nil {
		t.Fatal(err)
	}
	err := d.LUKSOpen(ctx, dev, name, []byte("wrong"), true)
	wantKind(t, err, errdefs.ErrPrecondition, "does not open the LUKS header on "+dev, "No key available")
	if err := d.LUKSResize(ctx, name); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.LUKSTestKey(ctx, dev, []byte("wrong")); ok || err != nil {
		t.Fatalf("LUKSTestKey(wrong) = %t, %v", ok, err)
	}
	wantKind(t, d.LUKSRemoveKey(ctx, dev, []byte("wrong")), errdefs.ErrNotFound, "no keyslot")
	// Busy on every try: refused; busy once, then closed; not open: fine.
	wantKind(t, d.LUKSClose(ctx, name), errdefs.ErrPrecondition, "still in use")
	if err := d.LUKSClose(ctx, name); err != nil {
		t.Fatalf("closing a mapping busy for a moment: %v", err)
	}
	if err := d.LUKSClose(ctx, name); err != nil {
		t.Fatalf("closing a mapping that is not open: %v", err)
	}
	for _, line := range script.Ran() {
		if strings.Contains(line, key) {
			t.Fatalf("a command line holds the passphrase: %s", line)
		}
	}
}
