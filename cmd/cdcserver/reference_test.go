package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/node"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/synthetic"
	"github.com/cdcflow/eventservice/internal/refdoc"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference/ from the code")

// The references of the commands and their flags are what the code
// defines: serve's and the synthetic server's flags as tables made from
// their FlagSets (DefaultConfig, BindFlags), and the help that cdcserver
// --help and cdcserver help COMMAND print for the other commands. The
// metrics' references are cmd/cdcserver/app/replicate's (serve) and
// cmd/cdcserver/app/synthetic's (the synthetic server). The README's short
// table of serve's flags is written by hand, but must name every flag once
// with its default.
func TestReferenceDocs(t *testing.T) {
	serve := flag.NewFlagSet("cdcserver serve", flag.ContinueOnError)
	cfg := replicate.DefaultConfig()
	cfg.BindFlags(serve)
	require.NoError(t, refdoc.Sync("../../docs/reference/serve-flags.md", "serve-flags", refdoc.FlagTable(serve), *update))
	readmeNamesEveryFlag(t, "../../README.md", "### `serve`'s flags", serve)

	server := flag.NewFlagSet("cdcserver server", flag.ContinueOnError)
	ncfg := node.DefaultConfig()
	ncfg.BindFlags(server)
	require.NoError(t, refdoc.Sync("../../docs/reference/server-flags.md", "server-flags", refdoc.FlagTable(server), *update))

	synFlags := flag.NewFlagSet("cdcserver "+synthetic.Command, flag.ContinueOnError)
	scfg := synthetic.DefaultConfig()
	scfg.BindFlags(synFlags)
	require.NoError(t, refdoc.Sync("../../docs/reference/synthetic-flags.md", "synthetic-flags", refdoc.FlagTable(synFlags), *update))

	help := func(args ...string) string {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(args, &out, &errOut), "%v: %s", args, errOut.String())
		require.Empty(t, errOut.String())
		return "```text\n$ cdcserver " + strings.Join(args, " ") + "\n" + out.String() + "```\n"
	}
	require.NoError(t, refdoc.Sync("../../docs/reference/commands.md", "overview", help("--help"), *update))
	for _, cmd := range []string{"status", "compare", "remove", "cli"} {
		require.NoError(t, refdoc.Sync("../../docs/reference/commands.md", cmd, help("help", cmd), *update))
	}
}

// readmeNamesEveryFlag checks the Markdown table under heading in the
// document at path: its rows name flags in their first cell (`--a`, `--b`)
// and their defaults in the second, in the same order (an empty cell: all
// empty); together they must be fs's flags, each once, with its default.
// The table is the README's: a difference is fixed there, by hand.
func readmeNamesEveryFlag(t *testing.T, path, heading string, fs *flag.FlagSet) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	require.True(t, ok, "%s: no heading %q", path, heading)
	seen := map[string]bool{}
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if rows > 0 && !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "| `--") || len(cells) < 3 {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows++
		names := strings.Split(cells[0], ", ")
		var defs []string
		if cells[1] != "" {
			defs = strings.Split(cells[1], ", ")
			require.Len(t, defs, len(names), "%s: %s: one default per flag", path, line)
		}
		for i, n := range names {
			name := strings.TrimPrefix(strings.Trim(n, "`"), "--")
			f := fs.Lookup(name)
			require.NotNil(t, f, "%s names --%s, which %s does not have", path, name, fs.Name())
			require.False(t, seen[name], "%s names --%s twice", path, name)
			seen[name] = true
			def := ""
			if defs != nil {
				def = strings.Trim(defs[i], "`")
			}
			require.Equal(t, refdoc.Default(f), def, "%s: the default of --%s (fix the table by hand)", path, name)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		require.True(t, seen[f.Name], "%s: the table under %q lacks --%s (add it by hand)", path, heading, f.Name)
	})
}
