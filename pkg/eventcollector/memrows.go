package eventcollector

import (
	"github.com/cdcflow/eventservice/pkg/common"
)

// rowArena keeps a MemorySink's applied rows where the garbage collector
// does not trace them: their bytes in chunks of arenaChunkBytes, each row
// as a rowRef of offsets in chunks of refChunkRows, and each applied batch
// as a refRange, none holding a pointer, so that a million retained rows
// are a few hundred objects to mark, not a million (nor a batch each).
// Kept as the collector handed them over (three pointers each), the rows
// were the synthetic runs' largest live object graph, and every GC cycle's
// mark phase walked them all while taking a core from the pipeline
// (docs/benchmarks.md, "Scale runs").
//
// INVARIANT: bytes once written are never written again (a chunk only
// grows into its spare capacity), so a row materialised from the arena
// may be read without the sink's lock while the sink keeps appending.
type rowArena struct {
	chunks    [][]byte
	refChunks [][]rowRef
}

// refChunkRows is a chunk of rowRefs (2.5 MiB); a batch larger than it
// gets a chunk of its own.
const refChunkRows = 1 << 16

// refRange is one applied batch: n rowRefs from refChunks[chunk][off].
type refRange struct {
	chunk, off, n uint32
}

// arenaChunkBytes is a chunk's size; a row larger than it gets a chunk of
// its own.
const arenaChunkBytes = 1 << 20

// rowRef is one row in a rowArena.
type rowRef struct {
	startTs, commitTs common.Ts
	chunk, off        uint32
	keyLen, valueLen  uint32
	oldLen            uint32
	op                common.OpType
	// nils has bit 0, 1, 2 set when the key, the value, the old value was
	// nil (not merely empty): a row reads back exactly as it was applied.
	nils uint8
}

// add copies rows into the arena and returns where they are.
func (a *rowArena) add(rows []common.Row) refRange {
	rc := len(a.refChunks) - 1
	if rc < 0 || cap(a.refChunks[rc])-len(a.refChunks[rc]) < len(rows) {
		a.refChunks = append(a.refChunks, make([]rowRef, 0, max(refChunkRows, len(rows))))
		rc++
	}
	at := len(a.refChunks[rc])
	a.refChunks[rc] = a.refChunks[rc][:at+len(rows)]
	refs := a.refChunks[rc][at:]
	for i := range rows {
		r := &rows[i]
		need := len(r.Key) + len(r.Value) + len(r.OldValue)
		c := len(a.chunks) - 1
		if c < 0 || cap(a.chunks[c])-len(a.chunks[c]) < need {
			a.chunks = append(a.chunks, make([]byte, 0, max(arenaChunkBytes, need)))
			c++
		}
		buf := a.chunks[c]
		refs[i] = rowRef{startTs: r.StartTs, commitTs: r.CommitTs, chunk: uint32(c), off: uint32(len(buf)),
			keyLen: uint32(len(r.Key)), valueLen: uint32(len(r.Value)), oldLen: uint32(len(r.OldValue)), op: r.Op,
			nils: nilBit(r.Key, 0) | nilBit(r.Value, 1) | nilBit(r.OldValue, 2)}
		buf = append(buf, r.Key...)
		buf = append(buf, r.Value...)
		a.chunks[c] = append(buf, r.OldValue...)
	}
	return refRange{chunk: uint32(rc), off: uint32(at), n: uint32(len(rows))}
}

func nilBit(b []byte, bit uint8) uint8 {
	if b == nil {
		return 1 << bit
	}
	return 0
}

// row materialises ref: its byte slices alias the arena, capped so that
// an append by the reader copies instead of writing into it.
func (a *rowArena) row(ref *rowRef) common.Row {
	buf := a.chunks[ref.chunk]
	at := ref.off
	field := func(n uint32, bit uint8) []byte {
		b := buf[at : at+n : at+n]
		at += n
		if ref.nils&(1<<bit) != 0 {
			return nil
		}
		return b
	}
	key := field(ref.keyLen, 0)
	value := field(ref.valueLen, 1)
	old := field(ref.oldLen, 2)
	return common.Row{Op: ref.op, Key: key, Value: value, OldValue: old, StartTs: ref.startTs, CommitTs: ref.commitTs}
}

// appendRows appends the rows of batches, materialised, to dst.
func (a *rowArena) appendRows(dst []common.Row, batches []refRange) []common.Row {
	for _, b := range batches {
		refs := a.refChunks[b.chunk][b.off : b.off+b.n]
		for i := range refs {
			dst = append(dst, a.row(&refs[i]))
		}
	}
	return dst
}
