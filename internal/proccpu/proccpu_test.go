package proccpu

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Read reads this process's own times and parent; Tree counts at least
// the process itself, and a pid that is not there is an error.
func TestReadAndTree(t *testing.T) {
	x := 0
	for i := range 20_000_000 { // some CPU of our own to read back
		x += i
	}
	require.NotZero(t, x)
	st, err := Read(os.Getpid())
	require.NoError(t, err)
	require.Equal(t, os.Getppid(), st.PPID)
	total, err := Tree(os.Getpid())
	require.NoError(t, err)
	require.GreaterOrEqual(t, total, st.Self)
	_, err = Read(1 << 30)
	require.Error(t, err)
}

// TreeBy files a live child under the kind its title is given, the
// process's own time under Exited, and sums to what Tree reads.
func TestTreeByFilesChildrenByTitle(t *testing.T) {
	// A shell that says it runs (so it has replaced the forked copy of
	// this process whose title it had until then) and waits for its
	// standard input to close.
	const script = "echo running; read x"
	child := exec.Command("sh", "-c", script)
	stdin, err := child.StdinPipe()
	require.NoError(t, err)
	stdout, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	defer func() { _ = stdin.Close(); _ = child.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "running\n", line)
	title, err := Title(child.Process.Pid)
	require.NoError(t, err)
	require.Equal(t, "sh -c "+script, title)
	before, err := Read(os.Getpid())
	require.NoError(t, err)
	seen := map[string]bool{}
	parts, err := TreeBy(os.Getpid(), func(title string) string {
		seen[title] = true
		if strings.HasPrefix(title, "sh -c ") {
			return "shell"
		}
		return "other"
	})
	require.NoError(t, err)
	require.True(t, seen["sh -c "+script], "the child's title was asked about: %v", seen)
	require.Contains(t, parts, "shell")
	require.Contains(t, parts, Exited)
	require.GreaterOrEqual(t, parts[Exited], before.Self, "this process's own time, read before")
	whole, err := TreeBy(os.Getpid(), nil)
	require.NoError(t, err)
	require.Equal(t, []string{""}, slices.Collect(maps.Keys(whole)), "a nil kind files everything under one key")
}
