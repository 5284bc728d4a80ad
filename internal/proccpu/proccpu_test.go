package proccpu

import (
	"os"
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
