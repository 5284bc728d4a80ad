package pgsink

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

// EnsureDefaults fills every zero field with its documented default and
// keeps what is set; Validate, on options with defaults filled in,
// reports every bad field at once, each wrapping ErrInvalidOptions.
func TestOptionsDefaultsAndValidation(t *testing.T) {
	o := Options{DSN: "postgres://x", FlushInterval: 2 * time.Second}.EnsureDefaults()
	require.Equal(t, 4, o.Workers)
	require.Equal(t, 5000, o.BatchRows)
	require.Equal(t, 20000, o.QueueRows)
	require.Equal(t, int64(DefaultQueueBytes), o.QueueBytes)
	require.Equal(t, int64(DefaultQueueBytes/4), o.laneBytes(), "each of the four lanes holds a quarter")
	require.Equal(t, 5, o.MaxFailures)
	require.Equal(t, 2*time.Second, o.FlushInterval, "a set field is kept")
	require.Equal(t, 2*time.Second, o.MaxFlushInterval, "MaxFlushInterval: 1s, or FlushInterval if larger")
	require.Equal(t, DefaultCheckpointInterval, o.CheckpointInterval)
	require.Equal(t, "default", o.Owner)
	require.Equal(t, time.Minute, o.FenceWait)
	require.Equal(t, zap.NewNop(), o.Logger)
	require.Equal(t, clock.OrReal(nil), o.Clock)
	require.NoError(t, o.Validate())

	bad := Options{Workers: 1000, BatchRows: 10, QueueRows: 5, QueueBytes: 1000, MaxFlushInterval: time.Millisecond}.EnsureDefaults()
	err := bad.Validate()
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, field := range []string{"DSN", "Workers", "QueueRows", "QueueBytes", "MaxFlushInterval"} {
		require.Contains(t, err.Error(), field, "every problem is reported")
	}
	_, err = New(Options{})
	require.ErrorIs(t, err, ErrInvalidOptions, "New validates")
}

// rowOverhead, what QueueBytes counts for a row beyond its bytes, is a
// common.Row's size.
func TestRowOverheadIsARowsSize(t *testing.T) {
	require.Equal(t, int(unsafe.Sizeof(common.Row{})), rowOverhead)
}
