package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBadFlagsExitTwoWithUsage(t *testing.T) {
	for _, args := range [][]string{
		{"synthetic", "--tables", "0"},
		{"synthetic", "--refuse-rate", "1.5"},
		{"synthetic", "--metrics-addr", "0.0.0.0:1"},
		{"synthetic", "--no-such-flag"},
		{"synthetic", "stray-argument"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(args, &out, &errOut), "%v", args)
		require.Contains(t, errOut.String(), "usage: cdcserver synthetic", "%v", args)
		require.Empty(t, out.String(), "nothing on stdout for %v", args)
	}
}

// cdcserver without a command lists its commands on stdout and exits 0
// (it once ran the synthetic workload); a flag or a word that is no
// command is a usage error, and a flag is pointed at the command it
// belongs to.
func TestWithoutACommandItListsTheCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(nil, &out, &errOut))
	require.Empty(t, errOut.String())
	var help bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &help, &errOut))
	require.Equal(t, help.String(), out.String(), "the same as --help")
	for _, c := range commands() {
		require.Contains(t, out.String(), "\n  "+c.name+" ", c.name)
	}

	for _, args := range [][]string{{"--tables", "10"}, {"stray"}} {
		out.Reset()
		errOut.Reset()
		require.Equal(t, 2, run(args, &out, &errOut), "%v", args)
		require.Empty(t, out.String(), "%v", args)
		require.Contains(t, errOut.String(), "usage: cdcserver COMMAND", "%v", args)
	}
	require.Contains(t, errOut.String(), `no command "stray"`)
	errOut.Reset()
	run([]string{"--tables", "10"}, &out, &errOut)
	require.Contains(t, errOut.String(), "cdcserver synthetic --tables 10")
}

func TestJSONRunVerifiesAndExitsZero(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"synthetic", "--tables", "10", "--rate", "1000", "--duration", "500ms", "--json", "--metrics-addr", "",
		"--progress-interval", "0", "--log-level", "error"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var sum map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &sum), out.String())
	require.Equal(t, true, sum["verified"])
	require.Equal(t, 10.0, sum["dispatchers"])
	require.Equal(t, 0.0, sum["lost_wakeups"])
}

// serve and compare: bad flags and a source that cannot be reached exit
// 2 with the reason; --version names the build.
func TestServeAndCompareSetupErrorsExitTwo(t *testing.T) {
	bad := "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"
	for _, args := range [][]string{
		{"serve"}, // no --source, no --sink
		{"serve", "--source", bad, "--sink", bad, "--log-format", "xml"},
		{"serve", "--source", bad, "--sink", bad, "--metrics-addr", ""},
		{"compare", "--source", bad},
		{"compare", "--source", bad, "--sink", bad},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(args, &out, &errOut), "%v: %s", args, errOut.String())
		require.NotEmpty(t, errOut.String(), "%v says why", args)
	}
	var out bytes.Buffer
	require.Equal(t, 0, run([]string{"--version"}, &out, &bytes.Buffer{}))
	require.Contains(t, out.String(), "cdcserver")
	require.Contains(t, out.String(), "go1.")
}

// cdcserver --help lists the commands, and help COMMAND shows a
// command's flags; a command that does not exist is a usage error.
func TestHelpListsTheCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &out, &errOut))
	for _, c := range []string{"serve", "status", "compare", "remove", "help", "synthetic"} {
		require.Contains(t, out.String(), c)
	}
	for _, c := range []string{"serve", "status", "compare", "remove"} {
		out.Reset()
		require.Equal(t, 0, run([]string{"help", c}, &out, &errOut), c)
		require.Contains(t, out.String(), "usage: cdcserver "+c, c)
		require.Contains(t, out.String(), "-source", c)
	}
	out.Reset()
	require.Equal(t, 0, run([]string{"help", "synthetic"}, &out, &errOut))
	require.Contains(t, out.String(), "usage: cdcserver synthetic")
	require.Contains(t, out.String(), "-tables")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"help", "nosuch"}, &out, &errOut))
	require.Contains(t, errOut.String(), "no command")
}

// status and remove need both databases: one missing is a usage error
// naming it, and with both given the flags parse and the command runs
// (here against nothing: a setup error, also exit 2, but not the usage).
func TestStatusAndRemoveNeedBothDatabases(t *testing.T) {
	bad := "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"
	for _, cmd := range []string{"status", "remove", "compare"} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run([]string{cmd, "--source", bad}, &out, &errOut), cmd)
		require.Contains(t, errOut.String(), "--sink required", cmd)
		errOut.Reset()
		require.Equal(t, 2, run([]string{cmd, "--source", bad, "--sink", bad}, &out, &errOut), cmd)
		require.NotContains(t, errOut.String(), "required", cmd)
		require.Contains(t, errOut.String(), "cdcserver "+cmd+":", cmd)
	}
}
