package main

import (
	"fmt"
	"io"
	"os"
	"strings"

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
		{"server", "run a node of a cluster of changefeeds coordinated through etcd (an embedded one without --etcd)", runServer},
		{"cli", "drive a cluster through a node's API: changefeed create|list|query|pause|resume|update|remove, node list|drain", runCLI},
		{synthetic.Command, "run the library on a seeded synthetic workload and verify what it delivered (benchmarks, tests)", runSynthetic},
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
}

// run is cdcserver: the command args name, or, without one, the overview
// on stdout (exit OK). A first argument that is no command is a usage
// error; a flag there says that flags follow a command (the synthetic
// workload, which once ran without one, is cdcserver synthetic).
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitcode.OK
	}
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
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "cdcserver: %s before a command: flags follow the command (the synthetic workload: cdcserver %s %s)\n\n",
			args[0], synthetic.Command, strings.Join(args, " "))
	} else {
		fmt.Fprintf(stderr, "cdcserver: no command %q\n\n", args[0])
	}
	usage(stderr)
	return exitcode.Setup
}

// runHelp is `cdcserver help [COMMAND]`: the overview, or a command's
// flags.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitcode.OK
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
