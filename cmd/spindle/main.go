// Command spindle is the Spindle CSI driver: one binary that serves the
// controller service, the node service, or both (--mode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	// The backend types the driver can configure.
	"github.com/spindle-csi/spindle/internal/attachd"
	_ "github.com/spindle-csi/spindle/internal/backend/all"
	"github.com/spindle-csi/spindle/internal/config"
	"github.com/spindle-csi/spindle/internal/driver"
	"github.com/spindle-csi/spindle/internal/logging"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "v0.0.0-dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the exit, so tests can drive it and read what it
// prints. The logger still writes to the process's stderr.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("spindle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts config.Options
	opts.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package already printed what is wrong and the usage
	}
	if *showVersion {
		fmt.Fprintln(stdout, version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "spindle: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(stderr, "spindle: invalid options:\n%v\n", err)
		return 2
	}
	log, err := logging.New(opts.LogFormat, opts.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "spindle: %v\n", err)
		return 2
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if opts.Mode == config.ModeAttachDaemon {
		if err := (&attachd.Server{Socket: opts.AttachDaemonSocket, Log: log}).Serve(ctx); err != nil {
			log.Error("attach daemon stopped with an error", zap.Error(err))
			return 1
		}
		return 0
	}
	d, err := driver.New(opts, version, log)
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	if err := d.Run(ctx); err != nil {
		log.Error("driver stopped with an error", zap.Error(err))
		return 1
	}
	return 0
}
