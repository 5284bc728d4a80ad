package eventservice

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// buildTaskForTest runs the row-memory part of a scan task of n rows on
// sc (what build.run does per row), closing a batch every batchRows rows.
func buildTaskForTest(sc *scanner, s *session, n, batchRows int) *build {
	b := sc.newBuild(s, 1<<40)
	for i := range n {
		r := common.Row{Op: common.OpPut, Key: fmt.Appendf(nil, "k%05d", i), Value: bytes.Repeat([]byte{'v'}, 100), StartTs: 10, CommitTs: 11}
		b.addRow(sc.arena.copyRow(&r))
		b.rows++
		b.bytes += r.Size()
		if b.batchRows == batchRows {
			b.closeBatch(false)
		}
	}
	b.closeBatch(false)
	return b
}

// taskRowsForTest returns deep copies of the rows of sc's messages.
func taskRowsForTest(sc *scanner) []common.Row {
	var rows []common.Row
	for _, m := range sc.msgs {
		if dml, ok := m.(*messaging.DMLBatch); ok {
			for _, r := range dml.Rows {
				r.Key, r.Value = bytes.Clone(r.Key), bytes.Clone(r.Value)
				rows = append(rows, r)
			}
		}
	}
	return rows
}

// TestSmallTaskPinsNoSharedRowMemory: a small task's messages get memory
// of their own and the scan worker's slab and arena are rewound, so a
// message waiting at a slow target cannot pin a whole shared slab and
// chunk; a large task keeps sharing them. The proof is by overwriting: the
// next task reuses the rewound memory, and the earlier task's rows are
// unchanged.
func TestSmallTaskPinsNoSharedRowMemory(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	d := &dispatcher{id: common.DispatcherIDFromUint64(7), span: common.Pack(common.TableSpan(7)), svc: h.svc, target: h.targetFor(t)}
	s := newSession(d, 1, 10)
	sc := newScanner(h.svc)

	// A first task leaves the slab and the arena partly used.
	buildTaskForTest(sc, s, 10, 4)
	sc.reset()
	slabBefore, arenaBefore := len(sc.slab), len(sc.arena.buf)
	require.Positive(t, slabBefore)

	// A small task: compacted, memory rewound.
	b := buildTaskForTest(sc, s, 5, 2)
	want := taskRowsForTest(sc)
	small := append([]messaging.Message(nil), sc.msgs...)
	sc.compactSmallTask(b)
	require.Equal(t, want, taskRowsForTest(sc), "compaction keeps every row")
	require.Equal(t, slabBefore, len(sc.slab), "the slab is rewound")
	require.Equal(t, arenaBefore, len(sc.arena.buf), "the arena is rewound")
	sc.reset()

	// The next task overwrites the rewound memory; the small task's rows
	// do not change.
	buildTaskForTest(sc, s, 5, 2)
	for i := range sc.slab[slabBefore:] {
		sc.slab[slabBefore+i].CommitTs = 999
	}
	for i := arenaBefore; i < len(sc.arena.buf); i++ {
		sc.arena.buf[i] = 'X'
	}
	var got []common.Row
	for _, m := range small {
		got = append(got, m.(*messaging.DMLBatch).Rows...)
	}
	require.Equal(t, want, got, "the small task's rows own their memory")
	sc.reset()

	// A large task keeps sharing the slab: it is not rewound.
	slabBefore = len(sc.slab)
	b = buildTaskForTest(sc, s, compactMaxRows+1, 256)
	sc.compactSmallTask(b)
	require.NotEqual(t, slabBefore, len(sc.slab))
}
