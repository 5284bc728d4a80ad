package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/cmd/cdcserver/app/server"
	"github.com/cdcflow/eventservice/internal/refdoc"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference/ from the code")

// The references of the commands and their flags are what the code
// defines: serve's and the synthetic server's flags as tables made from
// their FlagSets (DefaultConfig, BindFlags), and the help that cdcserver
// --help and cdcserver help COMMAND print for the other commands. The
// metrics' references are cmd/cdcserver/app/replicate's (serve) and
// cmd/cdcserver/app/server's (the synthetic server).
func TestReferenceDocs(t *testing.T) {
	serve := flag.NewFlagSet("cdcserver serve", flag.ContinueOnError)
	cfg := replicate.DefaultConfig()
	cfg.BindFlags(serve)
	require.NoError(t, refdoc.Sync("../../docs/reference/serve-flags.md", "serve-flags", refdoc.FlagTable(serve), *update))

	synthetic := flag.NewFlagSet("cdcserver", flag.ContinueOnError)
	scfg := server.DefaultConfig()
	scfg.BindFlags(synthetic)
	require.NoError(t, refdoc.Sync("../../docs/reference/synthetic-flags.md", "synthetic-flags", refdoc.FlagTable(synthetic), *update))

	help := func(args ...string) string {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(args, &out, &errOut), "%v: %s", args, errOut.String())
		require.Empty(t, errOut.String())
		return "```text\n$ cdcserver " + strings.Join(args, " ") + "\n" + out.String() + "```\n"
	}
	require.NoError(t, refdoc.Sync("../../docs/reference/commands.md", "overview", help("--help"), *update))
	for _, cmd := range []string{"status", "compare", "remove"} {
		require.NoError(t, refdoc.Sync("../../docs/reference/commands.md", cmd, help("help", cmd), *update))
	}
}
