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

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/synthetic"
)

// runSynthetic is `cdcserver synthetic`: the synthetic workload, verified
// (app/synthetic), or with --role collector one of its collector
// processes. Exit OK verified (a collector: stopped cleanly), Failed
// verification failed, NotDrained not drained by --drain-timeout, Setup
// bad flags or a setup error.
func runSynthetic(args []string, stdout, stderr io.Writer) int {
	cfg := synthetic.DefaultConfig()
	fs := flag.NewFlagSet("cdcserver "+synthetic.Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cdcserver %s [flags]\n\n"+
			"Runs an embedded changefeed server on a seeded synthetic workload and verifies delivery (cdcserver --help\n"+
			"lists the commands). Exit 0: verified (a collector process: stopped cleanly); 1: verification failed;\n"+
			"2: bad flags or a setup error; 3: not drained by --drain-timeout (late, nothing delivered is wrong).\n\n",
			synthetic.Command)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitcode.OK
		}
		return exitcode.Setup
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cdcserver %s: unexpected arguments %q\n", synthetic.Command, fs.Args())
		fs.Usage()
		return exitcode.Setup
	}
	cfg.Flags = strings.Join(args, " ")
	// The first SIGINT/SIGTERM stops the upstream and drains; the server
	// still verifies and prints its summary.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.Role == synthetic.RoleCollector {
		// A collector runs until SIGTERM/SIGINT and prints what it applied;
		// the service verifies its sinks.
		if _, err := synthetic.RunCollector(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "cdcserver %s: %v\n", synthetic.Command, err)
			if errors.Is(err, synthetic.ErrInvalidConfig) {
				fs.Usage()
			}
			return exitcode.Setup
		}
		return exitcode.OK
	}
	sum, err := synthetic.Run(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "cdcserver %s: %v\n", synthetic.Command, err)
		if errors.Is(err, synthetic.ErrInvalidConfig) {
			fs.Usage()
		}
		return exitcode.Setup
	}
	return synthetic.ExitStatus(sum)
}
