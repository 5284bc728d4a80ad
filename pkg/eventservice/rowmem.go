package eventservice

import (
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Row memory of the scan workers.
//
// A scan copies every row out of the store's iterator (pebble's key and
// value slices are valid only until the next step, and messages outlive
// the iterator). Copying each row into its own allocations costs three
// allocations per row; instead a scan worker writes rows into a shared
// slab (the Row structs) and a shared byte arena (keys and values), and a
// DMLBatch's Rows is a sub-slice of the slab. Neither is reused: a full
// slab or arena chunk is dropped and lives as long as some message uses it.
//
// Sharing has one cost: a message pins its whole slab and chunk. If a
// small task's message waits in a slow target's inbox while the rest of
// its slab went to fast targets long ago, one row could keep ~640 KiB
// alive, and a slow target's inbox of such messages would cost gigabytes.
// So a task of at most compactMaxRows rows and compactMaxBytes bytes is
// compacted before it is sent: its rows are copied into exact-size memory
// of its own and the slab and arena are rewound for the next task. Only
// tasks using at least 1/8 of a slab or chunk keep sharing them, which
// bounds what a waiting message pins to about 8 times its own rows.

// slabRows is the size of a row slab (about 384 KiB).
const slabRows = 4096

// arenaChunk is the size of an arena chunk.
const arenaChunk = 256 << 10

// A task is compacted if it has at most compactMaxRows rows and
// compactMaxBytes bytes of keys and values: an eighth of a slab and of a
// chunk. Larger tasks are where the shared memory pays (the scan
// throughput benchmark's tasks are 8192 rows), and they pin at most 8x.
const (
	compactMaxRows  = slabRows / 8
	compactMaxBytes = arenaChunk / 8
)

// rowArena copies rows out of the iterator's buffers into shared chunks:
// one allocation per 256 KiB instead of three per row. A chunk is never
// reused once dropped (messages hold on to it), only when a task is
// compacted and rewinds it.
type rowArena struct {
	buf []byte
	gen int // chunk replacements
}

func (a *rowArena) copyRow(r *common.Row) common.Row {
	k, v, o := len(r.Key), len(r.Value), len(r.OldValue)
	n := k + v + o
	buf := a.buf // one write of a.buf per row, not three
	if cap(buf)-len(buf) < n {
		buf = make([]byte, 0, max(arenaChunk, n))
		a.gen++
	}
	start := len(buf)
	buf = buf[:start+n]
	copy(buf[start:], r.Key)
	copy(buf[start+k:], r.Value)
	copy(buf[start+k+v:], r.OldValue)
	a.buf = buf
	b := buf[start : start+n : start+n]
	out := common.Row{Op: r.Op, StartTs: r.StartTs, CommitTs: r.CommitTs, Key: b[:k:k]}
	if r.Value != nil {
		out.Value = b[k : k+v : k+v]
	}
	if r.OldValue != nil {
		out.OldValue = b[k+v:]
	}
	return out
}

// rowMemMark is where a task began in the slab and the arena.
type rowMemMark struct {
	slabLen, slabGen   int
	arenaLen, arenaGen int
}

func (sc *scanner) markRowMem() rowMemMark {
	return rowMemMark{slabLen: len(sc.slab), slabGen: sc.slabGen, arenaLen: len(sc.arena.buf), arenaGen: sc.arena.gen}
}

func (b *build) addRow(r common.Row) {
	sc := b.sc
	if len(sc.slab) == cap(sc.slab) {
		// Full: the current batch moves to a fresh slab, keeping its rows
		// contiguous.
		cur := sc.slab[sc.batchStart:]
		next := make([]common.Row, len(cur), max(slabRows, 2*len(cur)))
		copy(next, cur)
		sc.slab, sc.batchStart = next, 0
		sc.slabGen++
	}
	sc.slab = append(sc.slab, r)
	b.batchRows++
}

// compactSmallTask gives a small task's rows memory of their own and
// rewinds the slab and arena to where the task began (when the task did
// not move on to a new slab or chunk), so the task's messages pin nothing
// shared. Called once the task's messages are final, before they are sent.
func (sc *scanner) compactSmallTask(b *build) {
	if b.rows == 0 || b.rows > compactMaxRows {
		return
	}
	size := 0
	for _, m := range sc.msgs {
		if dml, ok := m.(*messaging.DMLBatch); ok {
			for i := range dml.Rows {
				r := &dml.Rows[i]
				size += len(r.Key) + len(r.Value) + len(r.OldValue)
			}
		}
	}
	if size > compactMaxBytes {
		return
	}
	rows := make([]common.Row, 0, b.rows)
	own := rowArena{buf: make([]byte, 0, size)}
	for _, m := range sc.msgs {
		if dml, ok := m.(*messaging.DMLBatch); ok {
			start := len(rows)
			for i := range dml.Rows {
				rows = append(rows, own.copyRow(&dml.Rows[i]))
			}
			dml.Rows = rows[start:len(rows):len(rows)]
		}
	}
	mk := b.mark
	if mk.slabGen == sc.slabGen && mk.slabLen <= len(sc.slab) {
		clear(sc.slab[mk.slabLen:]) // drop the copies' pointers into the arena
		sc.slab = sc.slab[:mk.slabLen]
		sc.batchStart = mk.slabLen
	}
	if mk.arenaGen == sc.arena.gen && mk.arenaLen <= len(sc.arena.buf) {
		sc.arena.buf = sc.arena.buf[:mk.arenaLen]
	}
}
