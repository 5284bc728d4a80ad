// Command cdcserver runs an embedded changefeed server end to end: a
// synthetic upstream feeds the pebble event store, the event service
// schedules scans and sends to one collector per changefeed over the
// in-process transport, and at the end the server verifies that every
// dispatcher received exactly the upstream's rows, in order, up to the
// final resolved-ts. See README.md for the flags; `make run` runs the
// defaults.
//
// With --role service (or --remote-collectors N) the event service serves
// collectors in other processes over gRPC; --role collector is such a
// process.
//
// `cdcserver serve --source postgres://... --sink postgres://...` is a
// long-running PostgreSQL-to-PostgreSQL changefeed (cmd/cdcserver/app/replicate);
// `cdcserver compare` checks the tables equal; `cdcserver --version`.
//
// Exit status: 0 verified (a collector: stopped cleanly); 1 verification
// failed (a violation proven from what the sinks hold, drained or not); 2
// bad flags or a setup error; 3 not drained: some dispatcher had not
// reached the upstream's final resolved-ts at the drain deadline and
// nothing delivered is wrong (delivery was behind, not lossy).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/server"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			return runServe(args[1:], stderr)
		case "compare":
			return runCompare(args[1:], stdout, stderr)
		case "--version", "-version", "version":
			fmt.Fprintln(stdout, version())
			return 0
		}
	}
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("cdcserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cdcserver [flags]\n\nRuns an embedded changefeed server on a synthetic workload and verifies delivery.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return server.ExitVerified
		}
		return server.ExitBadFlags
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cdcserver: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return server.ExitBadFlags
	}
	cfg.Flags = strings.Join(args, " ")
	// The first SIGINT/SIGTERM stops the upstream and drains; the server
	// still verifies and prints its summary.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.Role == server.RoleCollector {
		// A collector runs until SIGTERM/SIGINT and prints what it applied;
		// the service verifies its sinks.
		if _, err := server.RunCollector(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "cdcserver: %v\n", err)
			if errors.Is(err, server.ErrInvalidConfig) {
				fs.Usage()
			}
			return server.ExitBadFlags
		}
		return server.ExitVerified
	}
	sum, err := server.Run(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "cdcserver: %v\n", err)
		if errors.Is(err, server.ErrInvalidConfig) {
			fs.Usage()
		}
		return server.ExitBadFlags
	}
	return server.ExitStatus(sum)
}
