package hugepages

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOptionsAreValidated(t *testing.T) {
	_, err := New(Options{Interval: time.Microsecond})
	require.ErrorIs(t, err, ErrInvalidOptions)
	k, err := New(Options{})
	require.NoError(t, err)
	require.Equal(t, time.Second, k.opts.Interval)
	k.Close() // without Start: nothing to stop
	k.Close() // idempotent
}
