package node

import (
	"flag"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/pgsink"
)

// parseServerFlags is DefaultConfig with args parsed over it.
func parseServerFlags(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.BindFlags(fs)
	err := fs.Parse(append([]string{"--data-dir", t.TempDir()}, args...))
	return cfg, err
}

// The event stores' sizes and the sinks' queue size take units, and a
// size out of range is refused
// with ErrInvalidConfig, naming the flag, as are the Go runtime's settings
// out of range.
func TestTheStoreSizeFlagsTakeUnitsAndRefuseBadSizes(t *testing.T) {
	cfg, err := parseServerFlags(t)
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Equal(t, int64(DefaultStoreCacheSize), cfg.StoreCacheSize)
	require.Equal(t, int64(DefaultStoreMemTableSize), cfg.StoreMemTableSize)
	require.Equal(t, int64(pgsink.DefaultQueueBytes), cfg.SinkQueueSize)

	cfg, err = parseServerFlags(t, "--store-cache-size", "1GiB", "--store-memtable-size", "4MiB", "--memory-limit", "2GiB", "--sink-queue-size", "16MiB")
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Equal(t, int64(2<<30), cfg.MemoryLimit)
	require.Equal(t, int64(1<<30), cfg.StoreCacheSize)
	require.Equal(t, int64(4<<20), cfg.StoreMemTableSize)
	require.Equal(t, int64(16<<20), cfg.SinkQueueSize)

	for _, bad := range [][]string{
		{"--store-cache-size", "0"}, {"--store-cache-size", "512KiB"},
		{"--store-memtable-size", "1000"}, {"--store-memtable-size", "5GiB"},
		{"--memory-limit", "1MiB"}, {"--gc-percent", "10"},
		{"--sink-queue-size", "8MiB"}, {"--sink-queue-size", "2TiB"},
	} {
		cfg, err := parseServerFlags(t, bad...)
		require.NoError(t, err, bad)
		err = cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig, bad)
		require.Contains(t, err.Error(), bad[0])
	}
	_, err = parseServerFlags(t, "--store-memtable-size", "8 megabytes")
	require.Error(t, err, "not a size")
}

// Every run of a changefeed on a node gets the node's one block cache and
// its memtable size: the event stores of its changefeeds share the cache
// (their memory bounded by --store-cache-size together, not one cache
// each); and the node's --sink-queue-size for its sink.
func TestEveryRunOnANodeSharesItsStoreCache(t *testing.T) {
	cfg, err := parseServerFlags(t, "--store-memtable-size", "2MiB", "--sink-queue-size", "32MiB")
	require.NoError(t, err)
	n := &node{cfg: cfg, cache: pebble.NewCache(cfg.StoreCacheSize)}
	defer n.cache.Unref()
	rs := &runners{n: n, running: map[string]*runner{}}
	a := rs.embedding(&runner{name: "a"}, prometheus.NewRegistry())
	b := rs.embedding(&runner{name: "b"}, prometheus.NewRegistry())
	require.NotNil(t, a.StoreCache)
	require.Same(t, n.cache, a.StoreCache)
	require.Same(t, a.StoreCache, b.StoreCache)
	require.Equal(t, uint64(2<<20), a.StoreMemTableBytes)
	require.Equal(t, a.StoreMemTableBytes, b.StoreMemTableBytes)
	require.Equal(t, int64(32<<20), a.SinkQueueBytes)
	require.Equal(t, a.SinkQueueBytes, b.SinkQueueBytes)
}

// /debug/pprof is served on a loopback address only.
func TestThePprofAddressIsLoopbackOnly(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:0", "localhost:6060", "[::1]:6060"} {
		cfg, err := parseServerFlags(t, "--pprof-addr", ok)
		require.NoError(t, err)
		require.NoError(t, cfg.Validate(), ok)
	}
	for _, bad := range []string{"0.0.0.0:6060", ":6060", "10.0.0.1:6060", "localhost"} {
		cfg, err := parseServerFlags(t, "--pprof-addr", bad)
		require.NoError(t, err)
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, bad)
	}
}

// A node runs under its --memory-limit (the Go heap's bound beside the
// event stores', which live outside it) and puts the runtime's back when
// it ends.
func TestANodeRunsUnderItsMemoryLimit(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("a set GOMEMLIMIT wins over --memory-limit")
	}
	before := debug.SetMemoryLimit(-1)
	n, _ := launchNode(t, "n1", "", func(c *Config) { c.MemoryLimit = 3 << 30 })
	testwait.Within(t, time.Minute, "the node ready", func() bool {
		resp, err := http.Get("http://" + n.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	require.Equal(t, int64(3<<30), debug.SetMemoryLimit(-1))
	n.stop()
	require.NoError(t, <-n.done, n.stderr.String())
	require.Equal(t, before, debug.SetMemoryLimit(-1), "the runtime's limit put back")
}
