package replicate

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// serve's runtime flags are checked by Validate (goruntime.Settings.Check;
// their effect is goruntime's test).
func TestRuntimeFlagsAreValidated(t *testing.T) {
	cfg := DefaultConfig()
	require.Equal(t, 300, cfg.GCPercent, "serve trades heap for CPU by default")
	cfg.Source, cfg.Sink = "postgres://a@127.0.0.1/x", "postgres://b@127.0.0.1/y"
	for _, good := range []int{0, 1, 1024} {
		cfg.MaxProcs = good
		require.NoError(t, cfg.Validate(), "--max-procs %d", good)
	}
	for _, bad := range []int{-1, 1025} {
		cfg.MaxProcs = bad
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "--max-procs %d", bad)
	}
	cfg.MaxProcs = 0
	cfg.MemoryLimit = 1 << 20
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "--memory-limit below 64MiB")
}

// --source-read-linger: 0 turns it off, up to a second is taken, a negative
// value or more than a second is refused.
func TestSourceReadLingerIsValidated(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Source, cfg.Sink = "postgres://a@127.0.0.1/x", "postgres://b@127.0.0.1/y"
	require.Equal(t, pgsource.DefaultReadLinger, cfg.SourceReadLinger)
	for _, good := range []time.Duration{0, time.Millisecond, time.Second} {
		cfg.SourceReadLinger = good
		require.NoError(t, cfg.Validate(), "--source-read-linger %v", good)
	}
	for _, bad := range []time.Duration{-time.Millisecond, time.Second + 1} {
		cfg.SourceReadLinger = bad
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "--source-read-linger %v", bad)
	}
}

// --source-receive-timeout: 0 turns it off; below 1s (reconnects for
// nothing on a slow link) or negative is refused.
func TestSourceReceiveTimeoutIsValidated(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Source, cfg.Sink = "postgres://a@127.0.0.1/x", "postgres://b@127.0.0.1/y"
	require.Equal(t, pgsource.DefaultReceiveTimeout, cfg.SourceReceiveTimeout)
	for _, good := range []time.Duration{0, time.Second, time.Hour} {
		cfg.SourceReceiveTimeout = good
		require.NoError(t, cfg.Validate(), "--source-receive-timeout %v", good)
	}
	for _, bad := range []time.Duration{-time.Second, time.Second - 1} {
		cfg.SourceReceiveTimeout = bad
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "--source-receive-timeout %v", bad)
	}
}

// --sink-queue-size takes units; it gives each --sink-workers lane at
// least 64KiB, and at most 1TiB in all, or is refused.
func TestSinkQueueSizeIsValidated(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Source, cfg.Sink = "postgres://a@127.0.0.1/x", "postgres://b@127.0.0.1/y"
	require.Equal(t, int64(pgsink.DefaultQueueBytes), cfg.SinkQueueSize)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.BindFlags(fs)
	require.NoError(t, fs.Parse([]string{"--sink-queue-size", "1GiB"}))
	require.Equal(t, int64(1<<30), cfg.SinkQueueSize)
	require.NoError(t, cfg.Validate())
	require.Error(t, fs.Parse([]string{"--sink-queue-size", "8 megabytes"}), "not a size")
	cfg.SinkWorkers = 4
	for _, good := range []int64{256 << 10, 1 << 40} {
		cfg.SinkQueueSize = good
		require.NoError(t, cfg.Validate(), "--sink-queue-size %d", good)
	}
	for _, bad := range []int64{0, 256<<10 - 1, 1<<40 + 1} {
		cfg.SinkQueueSize = bad
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig, "--sink-queue-size %d", bad)
		require.Contains(t, err.Error(), "--sink-queue-size")
	}
}

// TestInboxBytesFollowTheSinkQueue: the service-to-collector inbox holds an
// eighth of the bytes of the sink's queue, at least a scan task's, at most
// what an int holds everywhere.
func TestInboxBytesFollowTheSinkQueue(t *testing.T) {
	require.Equal(t, 8<<20, inboxBytes(Config{SinkQueueSize: pgsink.DefaultQueueBytes}))
	require.Equal(t, 16<<20, inboxBytes(Config{SinkQueueSize: 128 << 20}))
	require.Equal(t, 4<<20, inboxBytes(Config{SinkQueueSize: 256 << 10}), "a scan task's bytes at least")
	require.Equal(t, 1<<31-1, inboxBytes(Config{SinkQueueSize: pgsink.MaxQueueBytes}))
}
