package eventstore

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// writeAndRead registers a dispatcher of table on env's store, pushes
// rows, flushes pebble so that a scan reads them from sstables (through
// the block cache), and scans them back.
func writeAndRead(t *testing.T, env *testEnv, table int64) {
	t.Helper()
	span := common.TableSpan(table)
	rec := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(uint64(table)), span, 10, rec))
	push(t, env.up.last(t, span), 40, put("a", 15, 20), put("b", 25, 30))
	rec.waitResolved(t, 40)
	require.NoError(t, env.store.db.Flush())
	rows, _ := scan(t, env.store, did(uint64(table)), ScanRange{Start: 10, End: 40})
	require.Equal(t, []string{"a", "b"}, keysOf(rows))
}

// Stores opened with one Cache use it, each with its own reference: a
// store's close leaves it to the other store and to its owner, whose own
// release (the last) is the cache's end. A store that took no reference
// and released one would free the cache under the other store, and the
// owner's release would panic (pebble's count below zero).
func TestStoresShareACacheAndLeaveItToItsOwner(t *testing.T) {
	c := pebble.NewCache(8 << 20)
	shared := func(o *Options) { o.Cache, o.FreshBytes, o.MemTableBytes = c, -1, 1<<20 } // every row written to pebble
	a, b := newTestEnv(t, shared), newTestEnv(t, shared)
	require.Same(t, c, a.store.cache)
	require.Same(t, c, b.store.cache)
	require.Equal(t, int64(8<<20), a.store.opts.CacheBytes, "the size is the cache's")

	writeAndRead(t, a, 1)
	require.Positive(t, c.Size(), "a's blocks are in the shared cache")
	require.NoError(t, a.store.Close())
	writeAndRead(t, b, 2)
	require.Positive(t, c.Size(), "b's blocks are in the shared cache")
	require.NoError(t, b.store.Close())

	// A store whose Open fails leaves the owner's reference as it was.
	foreign := filepath.Join(t.TempDir(), "foreign")
	require.NoError(t, os.MkdirAll(foreign, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(foreign, "precious.txt"), []byte("keep"), 0o644))
	_, err := Open(Options{Dir: foreign, Upstream: &fakeUpstreamForTest{}, Cache: c})
	require.ErrorIs(t, err, ErrInvalidOptions)
	again := newTestEnv(t, shared)
	writeAndRead(t, again, 3)
	require.NoError(t, again.store.Close())
	require.NotPanics(t, c.Unref, "the owner's reference is the last")
}

// A size that is not the shared cache's is refused: the store's size is
// its cache's.
func TestACacheSizeOtherThanTheSharedCachesIsRefused(t *testing.T) {
	c := pebble.NewCache(4 << 20)
	defer c.Unref()
	_, err := Open(Options{Upstream: &fakeUpstreamForTest{}, Cache: c, CacheBytes: 8 << 20})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "CacheBytes")
	require.Equal(t, int64(4<<20), Options{Cache: c}.EnsureDefaults().CacheBytes)
}
