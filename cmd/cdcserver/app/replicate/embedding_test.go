package replicate

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// An embedded run's event store takes the process's block cache and the
// memtable size it was given; serve's own run keeps the store's defaults
// (a cache of its own).
func TestAnEmbeddedRunsStoreTakesTheProcesssCache(t *testing.T) {
	c := pebble.NewCache(1 << 20)
	defer c.Unref()
	cfg := DefaultConfig()
	require.Equal(t, eventstore.Options{Dir: "d"}, storeOptions(cfg, eventstore.Options{Dir: "d"}))
	cfg.embedding = &Embedding{StoreCache: c, StoreMemTableBytes: 8 << 20}
	o := storeOptions(cfg, eventstore.Options{Dir: "d"})
	require.Same(t, c, o.Cache)
	require.Equal(t, uint64(8<<20), o.MemTableBytes)
	require.Equal(t, "d", o.Dir)
}
