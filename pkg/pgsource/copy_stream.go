package pgsource

import (
	"context"
	"encoding/binary"
	"slices"
	"strings"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The stream's side of a copy (copy.go says what a copy is): it opens a
// chunk's window at its low watermark, notes what each change of the
// table does to the keys it touches while windows are open on it and,
// while a copy is active, the new keys of moves; at the high watermark it
// pushes the chunk's untouched rows. All of it runs on the stream's
// goroutine: Source.copyWindows and Source.copyTables are its own.

// touch is what the changes in a window did to one key.
type touch struct {
	key     [][]byte
	deleted bool // the last change deleted the row
	// incomplete: the row's values in the target may lack one the
	// changes left unchanged (a TOASTed value of a row not yet copied).
	incomplete bool
}

// recentCommits is how many of the stream's last commits' xids are kept
// (Source.recentXids), to find a chunk snapshot's in-progress transaction
// that the stream decoded before the low watermark.
const recentCommits = 4096

// noteCommit keeps a decoded commit's xid.
func (s *Source) noteCommit(xid uint32) {
	s.recentXids[s.recentN%recentCommits] = xid
	s.recentN++
}

// recentCommitXids returns the xids of the last recentCommits commits
// decoded (a chunk keeps them from its low watermark: the commits of its
// window would overwrite them by its high one).
func (s *Source) recentCommitXids() []uint32 {
	n := min(s.recentN, recentCommits)
	out := make([]uint32, 0, n)
	for i := s.recentN - n; i < s.recentN; i++ {
		out = append(out, s.recentXids[i%recentCommits])
	}
	return out
}

// committedBefore reports whether one of xids is among before, the
// commits decoded before a low watermark.
func (s *Source) committedBefore(xids, before []uint32) bool {
	if s.opts.skipRecentCheck {
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
// the stream forgets its window at the table's next change.
func (s *Source) dropCopy(c *copyChunk) {
	s.mu.Lock()
	delete(s.mu.copies, c.id)
	s.mu.Unlock()
}

// finishCopy ends a chunk the stream has pushed (at ts) or sends back.
func (s *Source) finishCopy(c *copyChunk, ts common.Ts, retry bool) {
	s.mu.Lock()
	_, live := s.mu.copies[c.id]
	delete(s.mu.copies, c.id)
	s.mu.Unlock()
	if live {
		c.ts, c.retry = ts, retry
		close(c.done)
	}
}

// copyMark handles a watermark in the stream.
func (ss *session) copyMark(ctx context.Context, m msgMessage) error {
	s := ss.s
	kind, id, ok := strings.Cut(string(m.content), ":")
	if !ok || !m.transactional || ss.cur == nil {
		return nil
	}
	s.mu.Lock()
	c := s.mu.copies[id]
	ready := c != nil && c.ready
	s.mu.Unlock()
	if c == nil {
		return nil // another process's, or given up
	}
	oid := c.st.oid
	switch kind {
	case "low":
		if c.first && c.st.fresh {
			// Emptied here, before the window opens (its own truncate
			// would send the chunk back): what the stream delivers after
			// applies on top, and the chunks fill the rest.
			if err := ss.add(ctx, oid, pgcodec.Truncate, nil, pgcodec.RowChange{Change: pgcodec.Truncate}); err != nil {
				return err
			}
		}
		// A stream read again from the slot may decode it twice: the
		// window starts again, and so do its notes.
		c.window, c.truncated, c.relNew, c.relFirst = map[string]*touch{}, false, false, false
		if c.before == nil {
			// Kept from the first decoding: read again from the slot, the
			// window's commits come before it in the ring a second time.
			c.before = s.recentCommitXids()
		}
		s.closeWindow(c)
		s.copyWindows[oid] = append(s.copyWindows[oid], c)
		if cur := s.copyTables[oid]; cur != c.st {
			s.copyTables[oid] = c.st
		}
	case "high":
		s.closeWindow(c)
		if !ready || c.window == nil || c.truncated || c.relNew || len(ss.subs[oid]) == 0 || s.committedBefore(c.xip, c.before) {
			s.finishCopy(c, ss.cur.ts, true)
			return nil
		}
		known, ok := ss.known[oid]
		if ok && c.relFirst && !sameShape(known, c.rel) {
			// The stream's description is of a change after the chunk's
			// snapshot: which one is newer is not known.
			s.finishCopy(c, ss.cur.ts, true)
			return nil
		}
		if !ok || !sameShape(known, c.rel) {
			if err := ss.adopt(c.rel); err != nil {
				return err
			}
		}
		return ss.pushChunk(ctx, c)
	}
	return nil
}

// pushChunk adds a chunk's untouched rows to the transaction as inserts
// and, for a final chunk, hands the keys to read again over.
func (ss *session) pushChunk(ctx context.Context, c *copyChunk) error {
	s, st := ss.s, c.st
	c.pushed = 0 // a transaction decoded again (the session ended before its commit) pushes again
	for wk, t := range c.window {
		if t.incomplete && !t.deleted {
			st.refetch[wk] = t.key
		}
	}
	for _, r := range c.rows {
		if _, touched := c.window[windowKey(r.key)]; touched {
			continue
		}
		if err := ss.add(ctx, st.oid, pgcodec.Insert, r.key, pgcodec.RowChange{Change: pgcodec.Insert, Columns: r.datums}); err != nil {
			return err
		}
		s.met.copyRows.Inc()
		s.copied.Add(1)
		c.pushed++
	}
	if c.final {
		for _, k := range st.refetch {
			c.refetch = append(c.refetch, k)
		}
		clear(st.refetch)
		if c.last && len(c.refetch) == 0 && s.copyTables[st.oid] == st {
			delete(s.copyTables, st.oid)
			c.ended = true
		}
	}
	ss.cur.copied = append(ss.cur.copied, c)
	return nil
}

// closeWindow stops noting the changes of c's table for c.
func (s *Source) closeWindow(c *copyChunk) {
	oid := c.st.oid
	ws := slices.DeleteFunc(s.copyWindows[oid], func(x *copyChunk) bool { return x == c })
	if len(ws) == 0 {
		delete(s.copyWindows, oid)
	} else {
		s.copyWindows[oid] = ws
	}
}

// noteCopies notes a change of a table that a copy is active on: in the
// windows open on it, and, for a move, the new key to read again (the
// sink took its unchanged value from an old row the target may not have).
func (ss *session) noteCopies(oid uint32, c pgcodec.Change, key [][]byte, change *pgcodec.RowChange) {
	s := ss.s
	if st := s.copyTables[oid]; st != nil {
		if st.abandoned.Load() {
			delete(s.copyTables, oid)
		} else if c == pgcodec.Move {
			st.refetch[windowKey(key)] = cloneKey(key)
		}
	}
	var dead []*copyChunk
	for _, w := range s.copyWindows[oid] {
		s.mu.Lock()
		_, live := s.mu.copies[w.id]
		s.mu.Unlock()
		if !live {
			// Given up; closed after the loop: closeWindow deletes from
			// the slice being ranged over, which moved the next window
			// into this one's place and left a nil at its end.
			dead = append(dead, w)
			continue
		}
		switch c {
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
	for _, w := range dead {
		s.closeWindow(w)
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
func (s *Source) relationChanged(oid uint32, seen bool) {
	for _, w := range s.copyWindows[oid] {
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
