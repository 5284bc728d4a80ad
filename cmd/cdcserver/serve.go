package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/server"
)

// Exit statuses of serve and compare: 0 a clean stop (compare: equal),
// 1 the changefeed stopped (compare: a table differs), 2 bad flags or a
// setup error (a bad DSN, a source without wal_level=logical, a table
// without a key).
const exitStopped = 1

func runServe(args []string, stderr io.Writer) int {
	cfg := replicate.DefaultConfig()
	fs := flag.NewFlagSet("cdcserver serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cdcserver serve --source postgres://... --sink postgres://... [flags]\n\n"+
			"Replicates a PostgreSQL database into another through the event service, until SIGTERM; a restart resumes.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return server.ExitBadFlags
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := replicate.Run(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "cdcserver serve: %v\n", err)
		if errors.Is(err, replicate.ErrInvalidConfig) || errors.Is(err, replicate.ErrSetup) {
			return server.ExitBadFlags
		}
		return exitStopped
	}
	return 0
}

func runCompare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdcserver compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	source := fs.String("source", "", "the source database")
	sink := fs.String("sink", "", "the target database")
	pub := fs.String("publication", "cdcflow", "the publication whose tables are compared")
	if err := fs.Parse(args); err != nil || *source == "" || *sink == "" {
		fmt.Fprintln(stderr, "usage: cdcserver compare --source postgres://... --sink postgres://... [--publication P]")
		return server.ExitBadFlags
	}
	err := replicate.Compare(context.Background(), *source, *sink, *pub, stdout)
	switch {
	case err == nil:
		fmt.Fprintln(stdout, "EQUAL")
		return 0
	case errors.Is(err, replicate.ErrDiffer):
		fmt.Fprintf(stdout, "DIFFERENT: %v\n", err)
		return exitStopped
	default:
		fmt.Fprintf(stderr, "cdcserver compare: %v\n", err)
		return server.ExitBadFlags
	}
}

// version names the build: the module's version and the VCS revision.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "cdcserver (unknown build)"
	}
	rev, dirty := "unknown", ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = " (modified)"
			}
		}
	}
	return fmt.Sprintf("cdcserver %s, revision %s%s, %s", bi.Main.Version, rev, dirty, bi.GoVersion)
}
