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

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// command is a subcommand of cdcserver.
type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) int
}

// commands are cdcserver's subcommands, in the order an operator meets
// them.
func commands() []command {
	return []command{
		{"serve", "replicate a PostgreSQL database into another, until SIGTERM (a restart resumes)",
			func(args []string, _, stderr io.Writer) int { return runServe(args, stderr) }},
		{"status", "show a changefeed, whether or not serve runs: its binding, the WAL its slot holds, each table's progress", runStatus},
		{"compare", "check that the target's tables hold the source's rows", runCompare},
		{"remove", "remove a changefeed: its slot, its publication if it made it, the target's cdcflow state (the target's tables stay)", runRemove},
		{"version", "name the build", func(_ []string, stdout, _ io.Writer) int { fmt.Fprintln(stdout, version()); return exitcode.OK }},
	}
}

// usage is cdcserver's overview: the commands, then how to get help.
func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: cdcserver COMMAND [flags]\n\nA changefeed of PostgreSQL logical replication into another PostgreSQL database.\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-9s %s\n", "help", "help on a command: cdcserver help serve")
	fmt.Fprintf(w, "\nWithout a command, cdcserver runs the library's synthetic workload and verifies delivery (a benchmark;\n"+
		"its flags: cdcserver help synthetic).\n")
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			usage(stdout)
			return exitcode.OK
		case "help":
			return runHelp(args[1:], stdout, stderr)
		case "--version", "-version":
			fmt.Fprintln(stdout, version())
			return exitcode.OK
		}
		for _, c := range commands() {
			if c.name == args[0] {
				return c.run(args[1:], stdout, stderr)
			}
		}
	}
	return runSynthetic(args, stdout, stderr)
}

// runHelp is `cdcserver help [COMMAND]`: the overview, or a command's
// flags.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitcode.OK
	}
	if args[0] == "synthetic" {
		return runSynthetic([]string{"-h"}, stdout, stdout)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run([]string{"-h"}, stdout, stdout)
		}
	}
	fmt.Fprintf(stderr, "cdcserver: no command %q\n\n", args[0])
	usage(stderr)
	return exitcode.Setup
}

// runSynthetic runs the synthetic workload (cdcserver without a command).
func runSynthetic(args []string, stdout, stderr io.Writer) int {
	cfg := synthetic.DefaultConfig()
	fs := flag.NewFlagSet("cdcserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cdcserver [flags]\n\nRuns an embedded changefeed server on a synthetic workload and verifies delivery (cdcserver --help lists the commands).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitcode.OK
		}
		return exitcode.Setup
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cdcserver: unexpected arguments %q\n", fs.Args())
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
			fmt.Fprintf(stderr, "cdcserver: %v\n", err)
			if errors.Is(err, synthetic.ErrInvalidConfig) {
				fs.Usage()
			}
			return exitcode.Setup
		}
		return exitcode.OK
	}
	sum, err := synthetic.Run(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "cdcserver: %v\n", err)
		if errors.Is(err, synthetic.ErrInvalidConfig) {
			fs.Usage()
		}
		return exitcode.Setup
	}
	return synthetic.ExitStatus(sum)
}
