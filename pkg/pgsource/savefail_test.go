package pgsource

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
)

// failingPositions is a PositionStore that refuses to save while failing
// is set (the edge under test: the store of positions is the target, and
// the target is down).
type failingPositions struct {
	*memPositions
	failing  atomic.Bool
	attempts atomic.Int64
}

func (p *failingPositions) Save(ctx context.Context, slot string, pos Position) error {
	p.attempts.Add(1)
	if p.failing.Load() {
		return errors.New("the target is down")
	}
	return p.memPositions.Save(ctx, slot, pos)
}

// A position that cannot be saved (the target down) is not confirmed, and
// the session goes on: the source's stream is fine, and the target's
// outage is the sink's to report. It ended the session at every status
// report before, so a target outage read as the source's stream ending,
// over and over. Once saving works again the slot moves on.
func TestAPositionThatCannotBeSavedDoesNotEndTheSession(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	pos := &failingPositions{memPositions: e.pos}
	var mu sync.Mutex
	var safe common.Ts
	src := e.source(func(o *testOptions) {
		o.Positions = pos
		o.SafePoint = func() (common.Ts, bool) {
			mu.Lock()
			defer mu.Unlock()
			return safe, safe != 0
		}
	})
	_, sinks := openAndSubscribe(t, e, src, "t1")
	sink := sinks["t1"]
	sink.waitFor("the snapshot", func() bool { return sink.resolved > 0 })
	pos.failing.Store(true)
	e.exec("INSERT INTO t1 VALUES (1)")
	sink.waitFor("the row", func() bool { return len(sink.rows) == 1 && sink.resolved >= sink.rows[0].CommitTs })
	before := src.Position()
	mu.Lock()
	safe = sink.rows[0].CommitTs // durable downstream: the slot may move, but the save fails
	mu.Unlock()
	from := pos.attempts.Load()
	testwait.Within(t, time.Minute, "saves tried", func() bool { return pos.attempts.Load() >= from+3 })
	require.Equal(t, before, src.Position(), "nothing confirmed that was not saved")
	require.Zero(t, testutilValue(src.met.reconnects), "the session went on")
	e.exec("INSERT INTO t1 VALUES (2)")
	sink.waitFor("rows still stream", func() bool { return len(sink.rows) == 2 })

	pos.failing.Store(false)
	testwait.Within(t, time.Minute, "saved and confirmed once it works", func() bool { return src.Position().LSN > before.LSN })
	require.Zero(t, testutilValue(src.met.reconnects))
}
