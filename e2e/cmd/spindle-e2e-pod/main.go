// Command spindle-e2e-pod is the whole userland of the e2e tests' pod image
// (and of the cluster's pause image): a static binary, so the image needs no
// shell and no libc. Each subcommand does one thing a test asserts on and
// writes its result to the container's termination message, which the test
// reads from the Pod's status, and prints it (the pod's log). Tests also
// run it in a running pod with `kubectl exec` (e.g. verify a file another
// pod wrote).
//
//	pause                      sleep until SIGTERM, reaping children
//	write FILE BYTES           random data + FILE.sha256, fsync'd; then pause
//	verify FILE                check FILE against FILE.sha256; exit 1 on mismatch
//	write-block DEV BYTES      random data at offset 0 of a block device, its
//	                           hex checksum right after it; then pause
//	verify-block DEV BYTES     check the data written by write-block
//	wait-size DIR BYTES SECS   wait until the filesystem at DIR is at least
//	                           BYTES large (statfs), then report its size
//	records FILE SECS          for SECS seconds, or until FILE.stop exists,
//	                           every 100 ms, append the next numbered record
//	                           to FILE and fsync it (a database's commit); log
//	                           every I/O error and every gap over 1 s between
//	                           two acknowledged records; report "records N
//	                           errors E maxgap MSms"
//	stop-records FILE          create FILE.stop: a records writer of FILE
//	                           (in another pod on the volume) stops
//	verify-records FILE N      check that FILE holds records 1..N, in order
//	kill-during COMM PATTERN SECS
//	                           once a process named COMM runs, SIGKILL every
//	                           process whose command line contains PATTERN
//	                           (a pod with the host's PIDs: a node plugin
//	                           killed mid-stage); report what it killed
package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const terminationLog = "/dev/termination-log"

func main() {
	msg, err := run(os.Args[1:])
	if err != nil {
		report("FAIL " + err.Error())
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if msg != "" {
		report(msg)
	}
}

// report writes the termination message (best effort: the pause image has
// no termination log) and prints it, so that a pod that keeps running
// tells it through its log too. A command run with `kubectl exec` in a
// running container (not its PID 1) only prints: the container's
// termination message stays its own.
func report(msg string) {
	if os.Getpid() == 1 {
		_ = os.WriteFile(terminationLog, []byte(msg), 0o644)
	}
	fmt.Println(msg)
}

func run(args []string) (string, error) {
	if len(args) == 0 {
		args = []string{"pause"}
	}
	need := func(n int) error {
		if len(args) != n+1 {
			return fmt.Errorf("%s: want %d arguments, got %d", args[0], n, len(args)-1)
		}
		return nil
	}
	switch args[0] {
	case "pause":
		pause()
		return "", nil
	case "write":
		if err := need(2); err != nil {
			return "", err
		}
		size, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return "", err
		}
		sum, err := writeFile(args[1], size)
		if err != nil {
			return "", err
		}
		report("wrote " + sum)
		pause()
		return "", nil
	case "verify":
		if err := need(1); err != nil {
			return "", err
		}
		return verifyFile(args[1])
	case "write-block":
		if err := need(2); err != nil {
			return "", err
		}
		size, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return "", err
		}
		sum, err := writeBlock(args[1], size)
		if err != nil {
			return "", err
		}
		report("wrote " + sum)
		pause()
		return "", nil
	case "verify-block":
		if err := need(2); err != nil {
			return "", err
		}
		size, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return "", err
		}
		return verifyBlock(args[1], size)
	case "wait-size":
		if err := need(3); err != nil {
			return "", err
		}
		want, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return "", err
		}
		secs, err := strconv.Atoi(args[3])
		if err != nil {
			return "", err
		}
		return waitSize(args[1], want, time.Duration(secs)*time.Second)
	case "records":
		if err := need(2); err != nil {
			return "", err
		}
		secs, err := strconv.Atoi(args[2])
		if err != nil {
			return "", err
		}
		return writeRecords(args[1], time.Duration(secs)*time.Second)
	case "stop-records":
		if err := need(1); err != nil {
			return "", err
		}
		if err := writeSynced(args[1]+stopSuffix, nil, os.O_CREATE|os.O_WRONLY); err != nil {
			return "", err
		}
		return "stopped " + args[1], nil
	case "kill-during":
		if err := need(3); err != nil {
			return "", err
		}
		secs, err := strconv.Atoi(args[3])
		if err != nil {
			return "", err
		}
		return killDuring("/proc", args[1], args[2], time.Duration(secs)*time.Second)
	case "verify-records":
		if err := need(2); err != nil {
			return "", err
		}
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return "", err
		}
		return verifyRecords(args[1], n)
	}
	return "", fmt.Errorf("unknown subcommand %q", args[0])
}

// record is the n-th record: fixed length, so that verify-records knows
// where each one is.
func record(n int) string { return fmt.Sprintf("record %010d\n", n) }

const recordEvery = 100 * time.Millisecond

// timeOfDay is how the writer and the tests print a moment (UTC).
const timeOfDay = "15:04:05.000"

// stopSuffix names the file whose existence stops a records writer.
const stopSuffix = ".stop"

// writeRecords appends a record and fsyncs it every recordEvery for d (or
// until path+stopSuffix exists), on one open file, as a database commits.
// A record counts as acknowledged when its fsync returned; an error is
// logged and the next record tried.
func writeRecords(path string, d time.Duration) (string, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	start := time.Now()
	last := start
	var maxGap time.Duration
	acked, errs := 0, 0
	tick := time.NewTicker(recordEvery)
	defer tick.Stop()
	for time.Since(start) < d {
		<-tick.C
		if _, err := os.Stat(path + stopSuffix); err == nil {
			break
		}
		n := acked + 1
		if _, err := f.WriteString(record(n)); err != nil {
			errs++
			fmt.Printf("ERROR write of record %d: %v\n", n, err)
			continue
		}
		if err := f.Sync(); err != nil {
			errs++
			fmt.Printf("ERROR fsync of record %d: %v\n", n, err)
			continue
		}
		now := time.Now()
		if gap := now.Sub(last); gap > maxGap {
			maxGap = gap
		}
		if gap := now.Sub(last); gap > time.Second {
			// The wall-clock time places the gap against the disruption's
			// (the test logs when that ran).
			fmt.Printf("gap %dms before record %d at %s\n", gap.Milliseconds(), n, now.UTC().Format(timeOfDay))
		}
		last, acked = now, n
		if n == 1 || n%50 == 0 {
			fmt.Printf("record %d\n", n)
		}
	}
	return fmt.Sprintf("records %d errors %d maxgap %dms", acked, errs, maxGap.Milliseconds()), nil
}

func verifyRecords(path string, n int) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	size := len(record(1))
	if len(data) < n*size {
		return "", fmt.Errorf("%s holds %d bytes, %d records, want at least %d", path, len(data), len(data)/size, n)
	}
	for i := 1; i <= n; i++ {
		if got := string(data[(i-1)*size : i*size]); got != record(i) {
			return "", fmt.Errorf("record %d reads back as %q", i, got)
		}
	}
	return fmt.Sprintf("verified %d records", n), nil
}

func pause() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}

func randomData(n int64) ([]byte, string, error) {
	data := make([]byte, n)
	if _, err := rand.Read(data); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
}

func writeSynced(path string, data []byte, flags int) error {
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeFile(path string, size int64) (string, error) {
	data, sum, err := randomData(size)
	if err != nil {
		return "", err
	}
	if err := writeSynced(path, data, os.O_CREATE|os.O_TRUNC|os.O_WRONLY); err != nil {
		return "", err
	}
	if err := writeSynced(path+".sha256", []byte(sum+"\n"), os.O_CREATE|os.O_TRUNC|os.O_WRONLY); err != nil {
		return "", err
	}
	return sum, nil
}

func verifyFile(path string) (string, error) {
	want, err := os.ReadFile(path + ".sha256")
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	got := hex.EncodeToString(sum[:])
	if got != strings.TrimSpace(string(want)) {
		return "", fmt.Errorf("checksum mismatch: file %s, recorded %s", got, strings.TrimSpace(string(want)))
	}
	return "verified " + got, nil
}

// The block layout: BYTES of data at offset 0, then the hex checksum.
func writeBlock(dev string, size int64) (string, error) {
	data, sum, err := randomData(size)
	if err != nil {
		return "", err
	}
	buf := append(data, []byte(sum)...)
	if err := writeSynced(dev, buf, os.O_WRONLY); err != nil {
		return "", err
	}
	return sum, nil
}

func verifyBlock(dev string, size int64) (string, error) {
	f, err := os.Open(dev)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, size+64)
	if _, err := io.ReadFull(f, buf); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf[:size])
	got, want := hex.EncodeToString(sum[:]), string(buf[size:])
	if !bytes.Equal([]byte(got), []byte(want)) {
		return "", fmt.Errorf("checksum mismatch: data %s, recorded %q", got, want)
	}
	return "verified " + got, nil
}

func waitSize(dir string, want int64, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			return "", err
		}
		size := int64(st.Blocks) * st.Bsize
		if size >= want {
			return fmt.Sprintf("size %d", size), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("filesystem at %s is %d bytes after %s, want at least %d", dir, size, timeout, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
