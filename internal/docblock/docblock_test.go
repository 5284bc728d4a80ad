package docblock

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The block's content is replaced and everything around it kept; a
// document without the block, or with its end before its start, is an
// error and stays as it was.
func TestReplace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	require.NoError(t, os.WriteFile(path, []byte("a\n<!-- x:table -->\nstale\n<!-- /x:table -->\nb\n"), 0o644))
	require.NoError(t, Replace(path, "x:table", "fresh\n"))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "a\n<!-- x:table -->\nfresh\n<!-- /x:table -->\nb\n", string(got))

	for _, doc := range []string{"no markers\n", "<!-- /x:table -->\n<!-- x:table -->\n"} {
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
		require.Error(t, Replace(path, "x:table", "y"))
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, doc, string(got))
	}
}
