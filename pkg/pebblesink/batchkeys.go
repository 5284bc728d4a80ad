package pebblesink

import "github.com/cockroachdb/pebble/v2"

// batchKeys answers "does the batch being built already hold this version
// key?" for the rare row that must be looked up (at or below its table's
// newest version), so that the batch itself can be a plain one.
//
// An indexed pebble batch answers it too, but keeps a skiplist of every
// entry for that: a second skiplist insert per row (beside the memtable's
// at commit), paid for lookups that a batch of rows above the newest never
// makes. The index here is built only when a lookup first needs it, from
// the batch's entries so far, and from then on follows every version the
// batch gets; a batch without such a lookup pays nothing.
type batchKeys struct {
	on   bool
	keys map[string]struct{}
}

// holds reports whether b, the batch being built, holds version key k,
// indexing b's version keys first if this batch has not needed it yet.
func (bk *batchKeys) holds(b *pebble.Batch, k []byte) bool {
	if !bk.on {
		bk.on = true
		if bk.keys == nil {
			bk.keys = map[string]struct{}{}
		}
		r := b.Reader()
		for {
			kind, ukey, _, ok, err := r.Next()
			if !ok || err != nil {
				// The sink wrote the batch itself: it always decodes.
				break
			}
			if kind == pebble.InternalKeyKindSet && len(ukey) > 0 && ukey[0] == 'v' {
				bk.keys[string(ukey)] = struct{}{}
			}
		}
	}
	_, ok := bk.keys[string(k)]
	return ok
}

// wrote notes that the batch now holds version key k.
func (bk *batchKeys) wrote(k []byte) {
	if bk.on {
		bk.keys[string(k)] = struct{}{}
	}
}

// reset forgets the batch, keeping the map's memory.
func (bk *batchKeys) reset() {
	bk.on = false
	clear(bk.keys)
}
