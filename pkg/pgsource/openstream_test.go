package pgsource

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
)

// slotActive reports whether a walsender holds the slot.
func (e *srcEnv) slotActive() bool {
	e.t.Helper()
	var active bool
	require.NoError(e.t, e.conn.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'cdcflow'").Scan(&active))
	return active
}

// OpenStream starts a resumed slot's stream before Start (a walsender
// holds the slot at once, while the tables subscribe), and Start's first
// session reads that stream: the rows written while no source ran arrive,
// in one session, without a replay. It is refused on a slot Open created,
// twice and after Start; Close closes a stream Start never read.
func TestOpenStreamStartsTheStreamBeforeStart(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	first := e.source(nil)
	_, err := first.Open(context.Background())
	require.NoError(t, err)
	require.ErrorIs(t, first.OpenStream(context.Background()), ErrInvalidOptions, "a slot Open created copies its snapshot first")
	first.Close()
	e.exec("INSERT INTO t1 SELECT g, 'while down' FROM generate_series(1, 20) g")

	src := e.source(nil)
	require.ErrorIs(t, src.OpenStream(context.Background()), ErrInvalidOptions, "before Open")
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	require.False(t, info.Created)
	require.False(t, e.slotActive())
	require.NoError(t, src.OpenStream(context.Background()))
	require.True(t, e.slotActive(), "a walsender holds the slot before Start")
	require.ErrorIs(t, src.OpenStream(context.Background()), ErrInvalidOptions, "twice")
	sink := newRecordingSink(t, info.ResumeTs)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.ResumeTs, sink)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start())
	require.ErrorIs(t, src.OpenStream(context.Background()), ErrInvalidOptions, "after Start")
	sink.waitFor("the rows written while no source ran", func() bool { return len(sink.rows) == 20 })
	e.exec("INSERT INTO t1 VALUES (100, 'after the start')")
	sink.waitFor("a row written after the start", func() bool { return len(sink.rows) == 21 })
	require.Zero(t, testutilValue(src.met.replays), "the early stream was read, not started again")
	require.Zero(t, testutilValue(src.met.reconnects))
	src.Close()

	unread := e.source(nil)
	_, err = unread.Open(context.Background())
	require.NoError(t, err)
	require.NoError(t, unread.OpenStream(context.Background()))
	require.True(t, e.slotActive())
	unread.Close()
	testwait.Within(t, time.Minute, "Close closed the stream Start never read", func() bool { return !e.slotActive() })
}
