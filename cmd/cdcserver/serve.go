package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
)

// serve, compare, status and remove exit with app/exitcode's statuses:
// OK a clean stop (compare: equal; status: nothing to act on; remove:
// removed), Failed the changefeed stopped (compare: a table differs;
// status: problems), Setup bad flags, a setup error or a refused start (a
// bad DSN, a source without wal_level=logical, a missing privilege, a slot
// that is not this changefeed's: checked before anything is changed).

func runServe(args []string, stderr io.Writer) int {
	cfg := replicate.DefaultConfig()
	fs := flag.NewFlagSet("cdcserver serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cdcserver serve --source postgres://... --sink postgres://... [flags]\n\n"+
			"Replicates a PostgreSQL database into another through the event service, until SIGTERM; a restart resumes.\n"+
			"Exit 0: a clean stop; 1: the changefeed stopped; 2: bad flags or a refused start (refused by its checks:\n"+
			"nothing was changed; a failure after them leaves what it made for the next start).\n\n")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, nil); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := replicate.Run(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "cdcserver serve: %v\n", err)
		if errors.Is(err, replicate.ErrInvalidConfig) || errors.Is(err, replicate.ErrSetup) {
			return exitcode.Setup
		}
		return exitcode.Failed
	}
	return exitcode.OK
}

func runCompare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdcserver compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	source := fs.String("source", "", "the source database")
	sink := fs.String("sink", "", "the target database")
	pub := fs.String("publication", "cdcflow", "the publication whose tables are compared")
	rows := fs.Int("rows", 0, "under each table that differs, name up to this many of its differing rows (by key; 0: none)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cdcserver compare --source postgres://... --sink postgres://... [--publication P] [--rows N]\n\n"+
			"Checks every table of the publication: its row count and an order-independent checksum on both sides.\n"+
			"Exit 0: EQUAL; 1: DIFFERENT (the first table that differs is named); 2: it cannot be read.\n\n")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, map[string]*string{"--source": source, "--sink": sink}); done {
		return code
	}
	if *rows < 0 {
		fmt.Fprintf(stderr, "cdcserver compare: --rows %d: a count of rows, 0 or more\n", *rows)
		return exitcode.Setup
	}
	err := replicate.CompareRows(context.Background(), *source, *sink, *pub, *rows, stdout)
	switch {
	case err == nil:
		fmt.Fprintln(stdout, "EQUAL")
		return exitcode.OK
	case errors.Is(err, replicate.ErrDiffer):
		fmt.Fprintf(stdout, "DIFFERENT: %v\n", err)
		return exitcode.Failed
	default:
		fmt.Fprintf(stderr, "cdcserver compare: %v\n", err)
		return exitcode.Setup
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

// runStatus is `cdcserver status`: exit OK when nothing needs acting on,
// Failed when the changefeed has problems (a table stopped or released,
// the slot lost or registered elsewhere), Setup when it cannot be read.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdcserver status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	source := fs.String("source", "", "the source database: postgres://user@host:port/db")
	sink := fs.String("sink", "", "the target database")
	slot := fs.String("slot", "cdcflow", "the changefeed's slot")
	pub := fs.String("publication", "cdcflow", "the publication (the registered one wins)")
	asJSON := fs.Bool("json", false, "print the status as one JSON object")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cdcserver status --source postgres://... --sink postgres://... [--slot S] [--json]\n\n"+
			"Shows a changefeed whether or not serve runs: what it is bound to, the slot (active, the WAL it retains and\n"+
			"has not confirmed, wal_status, safe_wal_size), the snapshot, each table's checkpoint and lag, stopped and\n"+
			"left-out tables with why. Exit 0: nothing to act on; 1: problems listed; 2: it cannot be read.\n\n")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, map[string]*string{"--source": source, "--sink": sink}); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := replicate.ReadStatus(ctx, *source, *sink, *slot, *pub)
	if err != nil {
		fmt.Fprintf(stderr, "cdcserver status: %v\n", err)
		return exitcode.Setup
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	} else {
		st.WriteText(stdout)
	}
	if st.StatusExit() != nil {
		return exitcode.Failed
	}
	return exitcode.OK
}

// runRemove is `cdcserver remove`: exit OK when removed (or nothing was
// left), Setup when refused or failed.
func runRemove(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdcserver remove", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o replicate.RemoveOptions
	fs.StringVar(&o.Source, "source", "", "the source database")
	fs.StringVar(&o.Sink, "sink", "", "the target database")
	fs.StringVar(&o.Slot, "slot", "cdcflow", "the changefeed's slot")
	fs.StringVar(&o.Publication, "publication", "cdcflow", "the publication (dropped only if the changefeed created it)")
	fs.BoolVar(&o.Force, "force", false, "remove it while a serve streams it: that serve is fenced out of the target (it exits) and its walsender terminated")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cdcserver remove --source postgres://... --sink postgres://... [--slot S] [--force]\n\n"+
			"Removes a changefeed: drops its slot (the WAL it retained is released), its publication if it created it, its\n"+
			"registration on the source and the target's cdcflow state; the target's tables and rows stay. Refused while a\n"+
			"serve streams the slot (unless --force) and for a slot registered for another target.\n\n")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, map[string]*string{"--source": &o.Source, "--sink": &o.Sink}); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := replicate.Remove(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "cdcserver remove: %v\n", err)
		return exitcode.Setup
	}
	fmt.Fprintln(stdout, "removed")
	return exitcode.OK
}

// parseFlags parses a command's flags, and says when the command ends
// there and with what: help (OK), a bad flag, or a required one missing
// (Setup, with the usage).
func parseFlags(fs *flag.FlagSet, args []string, required map[string]*string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitcode.OK, true
		}
		return exitcode.Setup, true
	}
	var missing []string
	for name, v := range required { // read after the parse that sets them
		if *v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		fmt.Fprintf(fs.Output(), "%s: %s required\n", fs.Name(), strings.Join(missing, " and "))
		fs.Usage()
		return exitcode.Setup, true
	}
	return exitcode.OK, false
}
