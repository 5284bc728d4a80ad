package replicate

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A start removes the temporary directories of serves that were killed
// (nobody holds their lock), and leaves alone a running serve's (its lock
// held), one not yet locked (no lock file) and anything not serve's.
func TestAStartRemovesTheStoresKilledServesLeft(t *testing.T) {
	root := t.TempDir()
	mk := func(name string, lockFile bool) string {
		dir := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "eventstore"), 0o700))
		if lockFile {
			require.NoError(t, os.WriteFile(filepath.Join(dir, lockName), nil, 0o600))
		}
		return dir
	}
	killed := mk(tempDirPrefix+"killed", true)
	running := mk(tempDirPrefix+"running", true)
	fresh := mk(tempDirPrefix+"fresh", false)
	other := mk("someone-else", true)
	held, ok, err := lockDataDir(running) // another fd: as another process's lock
	require.NoError(t, err)
	require.True(t, ok)
	defer held.release()
	_, ok, err = lockDataDir(running)
	require.NoError(t, err)
	require.False(t, ok, "a held lock is not taken twice")

	require.Equal(t, []string{killed}, removeStaleTempDirs(root))
	for _, dir := range []string{running, fresh, other} {
		require.DirExists(t, dir)
	}
	require.NoDirExists(t, killed)
}
