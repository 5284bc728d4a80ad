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
