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

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/node"
)

// runServer is `cdcserver server`: a node of a cluster. Exit 0: a clean
// stop (drained); 1: the node's membership was lost (start it again: it
// joins as a new member); 2: bad flags or it could not start.
func runServer(args []string, _, stderr io.Writer) int {
	cfg := node.DefaultConfig()
	fs := flag.NewFlagSet("cdcserver server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cdcserver server --data-dir DIR [--etcd URL,...] [flags]\n\n"+
			"Runs a node of a cluster of changefeeds coordinated through etcd (without --etcd, an embedded single-member\n"+
			"etcd in --data-dir). The nodes place the changefeeds that `cdcserver cli` creates; a node that dies loses its\n"+
			"changefeeds to the others after --lease-ttl. SIGTERM hands its changefeeds off first.\n"+
			"Exit 0: a clean stop; 1: the node's membership was lost (start it again); 2: bad flags or it could not start.\n\n")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, nil); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := node.Run(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "cdcserver server: %v\n", err)
		if errors.Is(err, node.ErrInvalidConfig) || errors.Is(err, node.ErrSetup) {
			return exitcode.Setup
		}
		return exitcode.Failed
	}
	return exitcode.OK
}

// runCLI is `cdcserver cli`.
func runCLI(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return node.CLI(ctx, args, stdout, stderr)
}
