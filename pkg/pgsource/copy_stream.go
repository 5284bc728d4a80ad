package pgsource

import (
	"encoding/binary"
	"slices"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The stream's side of a copy (copy.go says what a copy is), part of the
// WAL core: it opens a chunk's window at its low watermark, notes what
// each change of the table does to the keys it touches while windows are
// open on it and, while a copy is active, the new keys of moves; at the
// high watermark it pushes the chunk's untouched rows. The windows and the
// copies are the stream's state (streamState); the copier registers its
// chunks in Source.copies, which the shell reads for the core.

// touch is what the changes in a window did to one key.
type touch struct {
	key     [][]byte
	deleted bool // the last change deleted the row
	// incomplete: the row's values in the target may lack one the
	// changes left unchanged (a TOASTed value of a row not yet copied).
	incomplete bool
}

// recentCommits is how many of the stream's last commits' xids are kept
// (streamState.recentXids), to find a chunk snapshot's in-progress transaction
// that the stream decoded before the low watermark.
const recentCommits = 4096

// noteCommit keeps a decoded commit's xid.
func (c *core) noteCommit(xid uint32) {
	st := c.st
	st.recentXids[st.recentN%recentCommits] = xid
	st.recentN++
}

// recentCommitXids returns the xids of the last recentCommits commits
// decoded (a chunk keeps them from its low watermark: the commits of its
// window would overwrite them by its high one).
func (c *core) recentCommitXids() []uint32 {
	st := c.st
	n := min(st.recentN, recentCommits)
	out := make([]uint32, 0, n)
	for i := st.recentN - n; i < st.recentN; i++ {
		out = append(out, st.recentXids[i%recentCommits])
	}
	return out
}

// committedBefore reports whether one of xids is among before, the
// commits decoded before a low watermark.
func (c *core) committedBefore(xids, before []uint32) bool {
	if c.skipRecentCheck {
		return false
	}
	for _, x := range xids {
		if slices.Contains(before, x) {
			return true
		}
	}
	return false
}

// dropCopy takes a chunk out of the registry (its copy gave up on it):
// the shell tells the core at its next input (forgetCopies).
func (s *Source) dropCopy(c *copyChunk) {
	s.copies.Lock()
	delete(s.copies.m, c.id)
	s.copies.Unlock()
	s.copyDrops.Add(1)
}

// finishCopy ends a chunk the stream has pushed (at ts) or sends back.
func (s *Source) finishCopy(c *copyChunk, ts common.Ts, retry bool) {
	s.copies.Lock()
	_, live := s.copies.m[c.id]
	delete(s.copies.m, c.id)
	s.copies.Unlock()
	if live {
		c.ts, c.retry = ts, retry
		close(c.done)
	}
}

// hasCopies reports whether windows or copies are open on any table.
func (c *core) hasCopies() bool { return len(c.st.copyTables) > 0 || len(c.st.copyWindows) > 0 }

// forgetCopies closes the windows of chunks the copier gave up (live
// false) and forgets the copies it abandoned: the shell asks, under
// Source.copies, when the copier gave something up since the last time.
func (c *core) forgetCopies(live func(*copyChunk) bool, abandoned func(*copyState) bool) {
	for oid, st := range c.st.copyTables {
		if abandoned(st) {
			delete(c.st.copyTables, oid)
		}
	}
	var dead []*copyChunk
	for _, ws := range c.st.copyWindows {
		for _, w := range ws {
			if !live(w) {
				dead = append(dead, w)
			}
		}
	}
	for _, w := range dead {
		c.closeWindow(w)
	}
}

// copyMark handles a watermark (kind low or high) of chunk ch, as the
// shell found it registered (ready: the copier has filled it in).
func (c *core) copyMark(kind string, ch *copyChunk, ready bool) {
	oid := ch.st.oid
	switch kind {
	case "low":
		if ch.keyless {
			// Emptied at each attempt: the chunk is the whole table
			// (copy_keyless.go).
			c.add(oid, pgcodec.Truncate, nil, pgcodec.RowChange{Change: pgcodec.Truncate})
		} else if ch.first && ch.st.fresh {
			// Emptied here, before the window opens (its own truncate
			// would send the chunk back): what the stream delivers after
			// applies on top, and the chunks fill the rest.
			c.add(oid, pgcodec.Truncate, nil, pgcodec.RowChange{Change: pgcodec.Truncate})
		}
		// A stream read again from the slot may decode it twice: the
		// window starts again, and so do its notes.
		ch.window, ch.truncated, ch.relNew, ch.relFirst, ch.held = map[string]*touch{}, false, false, false, nil
		if ch.before == nil {
			// Kept from the first decoding: read again from the slot, the
			// window's commits come before it in the ring a second time.
			ch.before = c.recentCommitXids()
		}
		c.closeWindow(ch)
		c.st.copyWindows[oid] = append(c.st.copyWindows[oid], ch)
		if cur := c.st.copyTables[oid]; cur != ch.st {
			c.st.copyTables[oid] = ch.st
		}
	case "high":
		c.closeWindow(ch)
		if !ready || ch.window == nil || ch.truncated || ch.relNew || len(c.subs[oid]) == 0 || c.committedBefore(ch.sees.xip, ch.before) {
			c.emit(action{kind: actFinishCopy, chunk: ch, ts: c.cur.ts, retry: true})
			return
		}
		known, ok := c.st.known[oid]
		if ok && ch.relFirst && !sameShape(known, ch.rel) {
			// The stream's description is of a change after the chunk's
			// snapshot: which one is newer is not known.
			c.emit(action{kind: actFinishCopy, chunk: ch, ts: c.cur.ts, retry: true})
			return
		}
		if !ok || !sameShape(known, ch.rel) {
			c.adopt(ch.rel)
		}
		c.pushChunk(ch)
	}
}

// pushChunk adds a chunk's untouched rows to the transaction as inserts
// and, for a final chunk, hands the keys to read again over.
func (c *core) pushChunk(ch *copyChunk) {
	st := ch.st
	ch.pushed = 0 // a transaction decoded again (the session ended before its commit) pushes again
	for wk, t := range ch.window {
		if t.incomplete && !t.deleted {
			st.refetch[wk] = t.key
		}
	}
	if ch.keyless {
		c.pushKeylessChunk(ch)
	} else {
		for _, r := range ch.rows {
			if _, touched := ch.window[windowKey(r.key)]; touched {
				continue
			}
			c.add(st.oid, pgcodec.Insert, r.key, pgcodec.RowChange{Change: pgcodec.Insert, Columns: r.datums})
			c.tally.copyRows++
			ch.pushed++
		}
	}
	if ch.final {
		for _, k := range st.refetch {
			ch.refetch = append(ch.refetch, k)
		}
		clear(st.refetch)
		if ch.last && len(ch.refetch) == 0 && c.st.copyTables[st.oid] == st {
			delete(c.st.copyTables, st.oid)
			ch.ended = true
		}
	}
	c.cur.copied = append(c.cur.copied, ch)
}

// closeWindow stops noting the changes of ch's table for ch.
func (c *core) closeWindow(ch *copyChunk) {
	oid := ch.st.oid
	ws := slices.DeleteFunc(c.st.copyWindows[oid], func(x *copyChunk) bool { return x == ch })
	if len(ws) == 0 {
		delete(c.st.copyWindows, oid)
	} else {
		c.st.copyWindows[oid] = ws
	}
}

// noteCopies notes a change of a table that a copy is active on: in the
// windows open on it, and, for a move, the new key to read again (the
// sink took its unchanged value from an old row the target may not have).
func (c *core) noteCopies(oid uint32, kind pgcodec.Change, key [][]byte, change *pgcodec.RowChange) {
	if st := c.st.copyTables[oid]; st != nil && kind == pgcodec.Move {
		st.refetch[windowKey(key)] = cloneKey(key)
	}
	for _, w := range c.st.copyWindows[oid] {
		switch kind {
		case pgcodec.Truncate:
			w.truncated = true
		case pgcodec.Delete:
			w.note(key, true, false)
		case pgcodec.Insert:
			w.note(key, false, false)
		case pgcodec.Update:
			w.note(key, false, hasUnchanged(change.Columns))
		case pgcodec.Move:
			from := make([][]byte, len(change.From))
			for i, d := range change.From {
				from[i] = d.Text
			}
			w.note(from, true, false)
			w.note(key, false, true)
		}
	}
}

// note records a change of key in the window: a row deleted, or written
// leaving a value unchanged (whole, if an earlier change in the window
// wrote it whole).
func (c *copyChunk) note(key [][]byte, deleted, unchanged bool) {
	wk := windowKey(key)
	t := c.window[wk]
	if t == nil {
		t = &touch{key: cloneKey(key), incomplete: unchanged}
		c.window[wk] = t
	} else {
		t.incomplete = unchanged && (t.deleted || t.incomplete)
	}
	t.deleted = deleted
	if deleted {
		t.incomplete = false
	}
}

func cloneKey(key [][]byte) [][]byte {
	out := make([][]byte, len(key))
	for i, k := range key {
		out[i] = slices.Clone(k)
	}
	return out
}

// relationChanged marks the windows open on a table that got a new
// relation version (seen: one replaced a version the stream knew) or its
// first description in this stream.
func (c *core) relationChanged(oid uint32, seen bool) {
	for _, w := range c.st.copyWindows[oid] {
		if seen {
			w.relNew = true
		} else {
			w.relFirst = true
		}
	}
}

// windowKey is a key's text as a map key (each part length-prefixed).
func windowKey(key [][]byte) string {
	n := 0
	for _, k := range key {
		n += 4 + len(k)
	}
	b := make([]byte, 0, n)
	for _, k := range key {
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
	}
	return string(b)
}

// sameShape compares two relation versions by what the rows carry:
// names, types and keys (not the catalog's value for rows from before a
// column, which only a stream's description of an added column has).
func sameShape(a, b pgcodec.Relation) bool {
	if a.Schema != b.Schema || a.Name != b.Name || len(a.Columns) != len(b.Columns) {
		return false
	}
	for i := range a.Columns {
		x, y := a.Columns[i], b.Columns[i]
		if x.Name != y.Name || x.TypeOID != y.TypeOID || x.Type != y.Type || x.Key != y.Key || x.Base != y.Base {
			return false
		}
	}
	return true
}
