package linewatch

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Lines split across writes are matched whole, non-matching lines are
// kept but not sent, and matches beyond the buffer are dropped rather
// than blocking the writer.
func TestWatcherMatchesWholeLines(t *testing.T) {
	w := New(`^pid (\d+)$`)
	for _, chunk := range []string{"start\npi", "d 42\nnoise pid 7\n", "pid 9", "\n"} {
		n, err := w.Write([]byte(chunk))
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}
	require.Equal(t, []string{"pid 42", "42"}, <-w.Matches())
	require.Equal(t, []string{"pid 9", "9"}, <-w.Matches())
	select {
	case m := <-w.Matches():
		t.Fatalf("unexpected match %q", m)
	default:
	}
	require.Equal(t, "start\npid 42\nnoise pid 7\npid 9\n", w.String())
	for i := range matchBuffer + 5 {
		_, _ = fmt.Fprintf(w, "pid %d\n", i)
	}
	require.Len(t, w.Matches(), matchBuffer, "full: the rest dropped, the writer not blocked")
}
