package pebblesink

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prefixKeys are row keys that prefix one another, with the bytes an
// encoding must not confuse with a terminator or a commit-ts: 0x00, 0x01
// and 0xFF right after a shared prefix.
var prefixKeys = [][]byte{{}, {0}, {0, 0}, []byte("a"), []byte("a\x00"), []byte("a\x00\x00"), []byte("a\x00\x01"),
	[]byte("a\x01"), []byte("a\x06"), []byte("a\xff"), []byte("ab"), []byte("b")}

// prefixTs are commit-ts whose leading bytes fall below, at and above the
// keys' next bytes (the raw layout sorted "a"@ts against "ab" by them).
var prefixTs = []common.Ts{1, 0x0100, 0x6100_0000_0000_0000, common.ComposeTs(1_700_000_000_000, 0),
	common.ComposeTs(1_700_000_000_001, 3), math.MaxUint64}

func openTestSink(t *testing.T) *Sink {
	t.Helper()
	s, err := Open(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// applyVersions applies rows as dispatcher id of table, one checkpoint per
// row so that each gets the next sequence number in the order given.
func applyVersions(t *testing.T, s *Sink, id common.DispatcherID, table int64, rows []common.Row) {
	t.Helper()
	s.Bind(id, table)
	for i := range rows {
		require.NoError(t, s.ApplyRows(id, rows[i:i+1]))
		require.NoError(t, s.Checkpoint(id, common.Ts(i+1)))
	}
}

func prefixRows(t *testing.T) []common.Row {
	t.Helper()
	var rows []common.Row
	for _, k := range prefixKeys {
		for _, ts := range prefixTs {
			rows = append(rows, common.Row{Key: k, CommitTs: ts, Op: common.OpPut, Value: append(bytes.Clone(k), byte(ts))})
		}
	}
	return rows
}

func TestDurableSinkVersionsOrderedByKeyThenCommitTsWhenKeysArePrefixes(t *testing.T) {
	s := openTestSink(t)
	rows := prefixRows(t)
	shuffled := slices.Clone(rows)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	id := common.DispatcherIDFromUint64(1)
	applyVersions(t, s, id, 7, shuffled)

	got, err := s.Versions(7)
	require.NoError(t, err)
	want := slices.Clone(rows)
	slices.SortFunc(want, func(a, b common.Row) int {
		return cmp.Or(bytes.Compare(a.Key, b.Key), cmp.Compare(a.CommitTs, b.CommitTs))
	})
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].Key, got[i].Key, "version %d", i)
		require.Equal(t, want[i].CommitTs, got[i].CommitTs, "version %d of key %x", i, got[i].Key)
		require.Equal(t, want[i].Value, got[i].Value, "version %d", i)
		require.Equal(t, common.OpPut, got[i].Op)
	}

	// A re-delivery after a reset finds every version (the lookup uses the
	// same encoding) and keeps its first sequence number.
	seqs := map[string]uint64{}
	for _, v := range got {
		seqs[string(v.Key)+"@"+string(binary.BigEndian.AppendUint64(nil, uint64(v.CommitTs)))] = v.Seq
	}
	require.NoError(t, s.BeginEpoch(id, 2, 0))
	require.NoError(t, s.ApplyRows(id, rows))
	require.NoError(t, s.Checkpoint(id, common.Ts(len(rows)+1)))
	again, err := s.Versions(7)
	require.NoError(t, err)
	require.Len(t, again, len(got), "re-delivered versions are not stored twice")
	for _, v := range again {
		require.Equal(t, seqs[string(v.Key)+"@"+string(binary.BigEndian.AppendUint64(nil, uint64(v.CommitTs)))], v.Seq)
	}
}

// TestDurableSinkTablesAtTheEndsOfTheIDSpace round-trips versions and
// DDLs of tables 0 and math.MaxInt64 next to entries of their neighbours
// in the key space (table 1, MaxInt64-1, and what -1 and MinInt64 would
// encode to, written raw), and refuses a negative table.
func TestDurableSinkTablesAtTheEndsOfTheIDSpace(t *testing.T) {
	s := openTestSink(t)
	tables := []int64{0, 1, math.MaxInt64 - 1, math.MaxInt64}
	for i, table := range tables {
		id := common.DispatcherIDFromUint64(uint64(i + 1))
		s.Bind(id, table)
		row := common.Row{Key: []byte{0xFF, byte(i)}, CommitTs: 10, Op: common.OpPut, Value: []byte{byte(i)}}
		require.NoError(t, s.ApplyRows(id, []common.Row{row}))
		require.NoError(t, s.ApplyDDL(id, &messaging.DDL{TableID: table, CommitTs: 10, Query: "ddl"}))
		require.NoError(t, s.Checkpoint(id, 10))
	}
	// Entries just outside MaxInt64's range and below 0's, raw: the key
	// space's neighbours of the end tables (no int64 table writes them).
	for _, raw := range []uint64{1 << 63, math.MaxUint64} {
		require.NoError(t, s.db.Set(append(binary.BigEndian.AppendUint64([]byte{'v'}, raw), 0xFF, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 10),
			[]byte("seq-op-value"), pebble.Sync))
		require.NoError(t, s.db.Set(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{'d'}, raw), 10), []byte("neighbour"), pebble.Sync))
	}
	for i, table := range tables {
		vs, err := s.Versions(table)
		require.NoError(t, err, "table %d", table)
		require.Len(t, vs, 1, "table %d reads only its own versions", table)
		require.Equal(t, []byte{0xFF, byte(i)}, vs[0].Key)
		require.Equal(t, []byte{byte(i)}, vs[0].Value)
		ddls, err := s.DDLs(table)
		require.NoError(t, err)
		require.Equal(t, []messaging.DDL{{TableID: table, CommitTs: 10, Query: "ddl"}}, ddls, "table %d reads only its own DDLs", table)
	}
	for _, table := range []int64{-1, math.MinInt64} {
		_, err := s.Versions(table)
		require.ErrorIs(t, err, ErrInvalidTable)
		_, err = s.DDLs(table)
		require.ErrorIs(t, err, ErrInvalidTable)
	}
	id := common.DispatcherIDFromUint64(99)
	s.Bind(id, -1)
	require.NoError(t, s.ApplyRows(id, []common.Row{{Key: []byte("k"), CommitTs: 5}}))
	require.ErrorIs(t, s.Checkpoint(id, 5), ErrInvalidTable)
}

func TestTableBoundsAtTheEnds(t *testing.T) {
	for _, tc := range []struct {
		table  int64
		lo, hi []byte
	}{
		{0, []byte{'v', 0, 0, 0, 0, 0, 0, 0, 0}, []byte{'v', 0, 0, 0, 0, 0, 0, 0, 1}},
		{255, []byte{'v', 0, 0, 0, 0, 0, 0, 0, 0xFF}, []byte{'v', 0, 0, 0, 0, 0, 0, 1}},
		{math.MaxInt64, []byte{'v', 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, []byte{'v', 0x80}},
	} {
		lo, hi, err := tableBounds('v', tc.table)
		require.NoError(t, err)
		require.Equal(t, tc.lo, lo, "table %d", tc.table)
		require.Equal(t, tc.hi, hi, "table %d", tc.table)
		require.Negative(t, bytes.Compare(lo, hi))
	}
	_, _, err := tableBounds('v', -1)
	require.ErrorIs(t, err, ErrInvalidTable)
	require.Nil(t, prefixSuccessor([]byte{0xFF, 0xFF}), "no upper bound above an all-0xFF prefix")
	require.Equal(t, []byte{'w'}, prefixSuccessor([]byte{'v', 0xFF, 0xFF}))
}

func TestDurableSinkRefusesAnotherFormatAndReportsCorruptEntries(t *testing.T) {
	t.Run("raw layout", func(t *testing.T) {
		dir := t.TempDir()
		db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
		require.NoError(t, err)
		require.NoError(t, db.Set([]byte("s"), binary.BigEndian.AppendUint64(nil, 5), pebble.Sync))
		require.NoError(t, db.Close())
		_, err = Open(dir)
		require.ErrorIs(t, err, ErrSinkFormat)
	})
	t.Run("unknown format", func(t *testing.T) {
		dir := t.TempDir()
		db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
		require.NoError(t, err)
		require.NoError(t, db.Set([]byte("f"), []byte{9}, pebble.Sync))
		require.NoError(t, db.Close())
		_, err = Open(dir)
		require.ErrorIs(t, err, ErrSinkFormat)
	})
	t.Run("reopened", func(t *testing.T) {
		dir := t.TempDir()
		s, err := Open(dir)
		require.NoError(t, err)
		applyVersions(t, s, common.DispatcherIDFromUint64(1), 1, prefixRows(t)[:3])
		require.NoError(t, s.Close())
		s, err = Open(dir)
		require.NoError(t, err, "a sink of this format opens again")
		vs, err := s.Versions(1)
		require.NoError(t, err)
		require.Len(t, vs, 3)
		require.NoError(t, s.Close())
	})
	t.Run("corrupt entries", func(t *testing.T) {
		for _, k := range [][]byte{
			{0x61},                         // no terminator
			{0x61, 0x00},                   // cut after the escape byte
			{0x61, 0x00, 0x07, 0, 0, 0, 0}, // not an escape
			{0x61, 0x00, 0x01, 1, 2},       // commit-ts cut short
		} {
			s := openTestSink(t)
			require.NoError(t, s.db.Set(append(binary.BigEndian.AppendUint64([]byte{'v'}, 4), k...), make([]byte, 9), pebble.Sync))
			_, err := s.Versions(4)
			require.ErrorIs(t, err, ErrCorruptSink, "key %x", k)
		}
		s := openTestSink(t)
		require.NoError(t, s.db.Set(versionKey(4, []byte("k"), 1), []byte{1, 2}, pebble.Sync)) // value cut short
		_, err := s.Versions(4)
		require.ErrorIs(t, err, ErrCorruptSink)
		require.NoError(t, s.db.Set(binary.BigEndian.AppendUint64([]byte{'d'}, 4), []byte("no commit-ts"), pebble.Sync))
		_, err = s.DDLs(4)
		require.ErrorIs(t, err, ErrCorruptSink)
	})
}

// FuzzEscapedKeyOrder checks that version keys order as (key, commit-ts)
// and decode to what was encoded, whatever the keys' bytes.
func FuzzEscapedKeyOrder(f *testing.F) {
	for _, a := range prefixKeys {
		for _, b := range prefixKeys {
			f.Add(a, b, uint64(prefixTs[len(a)%len(prefixTs)]), uint64(prefixTs[len(b)%len(prefixTs)]))
		}
	}
	f.Fuzz(func(t *testing.T, a, b []byte, ta, tb uint64) {
		ka, kb := versionKey(5, a, common.Ts(ta)), versionKey(5, b, common.Ts(tb))
		want := cmp.Or(bytes.Compare(a, b), cmp.Compare(ta, tb))
		if got := bytes.Compare(ka, kb); got != want {
			t.Fatalf("versionKey(%x@%d) vs (%x@%d): %d, want %d", a, ta, b, tb, got, want)
		}
		lo, hi, err := tableBounds('v', 5)
		if err != nil || bytes.Compare(ka, lo) < 0 || bytes.Compare(ka, hi) >= 0 {
			t.Fatalf("versionKey(%x) outside its table's range [%x, %x): %v", a, lo, hi, err)
		}
		v, err := decodeVersion(ka[len(lo):], make([]byte, 9))
		if err != nil || !bytes.Equal(v.Key, a) || v.CommitTs != common.Ts(ta) {
			t.Fatalf("decode %x: %+v, %v; want %x@%d", ka, v, err, a, ta)
		}
	})
}

// A checkpoint of a dispatcher that was never bound is refused with
// ErrNotBound and persists nothing: its rows have no table.
func TestCheckpointOfAnUnboundDispatcherIsRefused(t *testing.T) {
	s := openTestSink(t)
	id := common.DispatcherIDFromUint64(7)
	require.NoError(t, s.ApplyRows(id, prefixRows(t)[:1]))
	require.ErrorIs(t, s.Checkpoint(id, 5), ErrNotBound)
	ckpt, err := s.CheckpointOf(id)
	require.NoError(t, err)
	require.Zero(t, ckpt)
}

// TestReDeliveriesKeepTheirFirstApplicationWithoutALookupAboveTheNewest:
// only rows at or below the table's newest stored version are looked up,
// yet every re-delivery keeps its first application's seq: one at or
// below the newest (looked up, also after a reopen, which reads the newest
// back), and a repeat of a row above it within the same batch.
func TestReDeliveriesKeepTheirFirstApplicationWithoutALookupAboveTheNewest(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	require.NoError(t, err)
	id := common.DispatcherIDFromUint64(1)
	s.Bind(id, 1)
	put := func(key string, ts common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte(key), CommitTs: ts}
	}
	require.NoError(t, s.ApplyRows(id, []common.Row{put("a", 10), put("b", 10), put("a", 20)}))
	require.NoError(t, s.Checkpoint(id, 20))
	first, err := s.Versions(1)
	require.NoError(t, err)
	require.Len(t, first, 3)

	// A replay from an older checkpoint, then a new row, repeated within
	// the batch above the newest.
	require.NoError(t, s.BeginEpoch(id, 2, 5))
	require.NoError(t, s.ApplyRows(id, []common.Row{put("a", 10), put("b", 10), put("a", 20), put("c", 30), put("c", 30)}))
	require.NoError(t, s.Checkpoint(id, 30))
	mid, err := s.Versions(1)
	require.NoError(t, err)
	var maxFirst uint64
	for _, v := range first {
		maxFirst = max(maxFirst, v.Seq)
	}
	cSeq := mid[slices.IndexFunc(mid, func(w Version) bool { return string(w.Key) == "c" })].Seq
	require.Equal(t, maxFirst+1, cSeq, "c, repeated in its batch, took one seq")
	require.NoError(t, s.Close())

	s, err = Open(dir)
	require.NoError(t, err)
	defer s.Close()
	s.Bind(id, 1)
	require.NoError(t, s.ApplyRows(id, []common.Row{put("c", 30), put("d", 40)})) // c again, after the reopen
	require.NoError(t, s.Checkpoint(id, 40))
	vs, err := s.Versions(1)
	require.NoError(t, err)
	require.Len(t, vs, 5, "a@10, a@20, b@10, c@30, d@40: each once")
	for _, v := range first {
		i := slices.IndexFunc(vs, func(w Version) bool { return bytes.Equal(w.Key, v.Key) && w.CommitTs == v.CommitTs })
		require.GreaterOrEqual(t, i, 0)
		require.Equal(t, v.Seq, vs[i].Seq, "%s@%d kept its first seq", v.Key, v.CommitTs)
	}
	c := vs[slices.IndexFunc(vs, func(w Version) bool { return string(w.Key) == "c" })]
	require.Equal(t, cSeq, c.Seq, "c, re-delivered after the reopen, kept its first seq (the newest was read back)")
}

// TestCheckpointBatchPersistsEveryEntryInOneBatch: the entries of a batch
// are persisted with their rows as Checkpoint would persist each, an
// unbound dispatcher fails alone, and a reopened sink reads them all back.
func TestCheckpointBatchPersistsEveryEntryInOneBatch(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	require.NoError(t, err)
	d1, d2, unbound := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2), common.DispatcherIDFromUint64(3)
	s.Bind(d1, 1)
	s.Bind(d2, 2)
	row := func(key string, ts common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte(key), CommitTs: ts}
	}
	require.NoError(t, s.ApplyRows(d1, []common.Row{row("a", 10)}))
	require.NoError(t, s.ApplyRows(d2, []common.Row{row("b", 11), row("c", 12)}))
	require.NoError(t, s.ApplyRows(unbound, []common.Row{row("z", 13)}))
	errs := make([]error, 3)
	s.CheckpointBatch([]eventcollector.SinkCheckpoint{{ID: d1, Ts: 20}, {ID: unbound, Ts: 20}, {ID: d2, Ts: 21}}, errs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrNotBound)
	require.NoError(t, errs[2])
	require.NoError(t, s.Close())

	s, err = Open(dir)
	require.NoError(t, err)
	defer s.Close()
	for id, want := range map[common.DispatcherID]common.Ts{d1: 20, d2: 21, unbound: 0} {
		got, err := s.CheckpointOf(id)
		require.NoError(t, err)
		require.Equal(t, want, got, "%v", id)
	}
	v1, err := s.Versions(1)
	require.NoError(t, err)
	v2, err := s.Versions(2)
	require.NoError(t, err)
	require.Len(t, v1, 1)
	require.Len(t, v2, 2)
	require.Equal(t, []uint64{v1[0].Seq + 1, v1[0].Seq + 2}, []uint64{v2[0].Seq, v2[1].Seq}, "one numbering across the batch")
}

// TestARepeatWithinOneBatchIsFoundInTheBatch: two dispatchers of one table
// deliver the same versions in one CheckpointBatch, above the table's
// newest stored version and at or below it. The batch is a plain one, so
// the second delivery is found by the batch's own index (batchKeys), not
// by a lookup in the database, which does not hold the batch yet: each
// version is written once, with its first delivery's seq.
func TestARepeatWithinOneBatchIsFoundInTheBatch(t *testing.T) {
	s := openTestSink(t)
	d1, d2, d3 := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2), common.DispatcherIDFromUint64(3)
	for _, d := range []common.DispatcherID{d1, d2, d3} {
		s.Bind(d, 1)
	}
	row := func(key string, ts common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte(key), CommitTs: ts}
	}
	require.NoError(t, s.ApplyRows(d1, []common.Row{row("z", 50)}))
	require.NoError(t, s.Checkpoint(d1, 50)) // the table's newest is 50
	// b@60 is above the newest: d1 writes it without a lookup. d2's a@20,
	// at or below it, is the batch's first lookup, which indexes what the
	// batch holds (b@60) and so finds d2's b@60; d3 repeats a@20, which the
	// index got when d2 wrote it.
	require.NoError(t, s.ApplyRows(d1, []common.Row{row("b", 60)}))
	require.NoError(t, s.ApplyRows(d2, []common.Row{row("a", 20), row("b", 60), row("c", 70)}))
	require.NoError(t, s.ApplyRows(d3, []common.Row{row("a", 20)}))
	errs := make([]error, 3)
	s.CheckpointBatch([]eventcollector.SinkCheckpoint{{ID: d1, Ts: 60}, {ID: d2, Ts: 70}, {ID: d3, Ts: 70}}, errs)
	for _, err := range errs {
		require.NoError(t, err)
	}
	vs, err := s.Versions(1)
	require.NoError(t, err)
	seq := map[string]uint64{}
	for _, v := range vs {
		seq[fmt.Sprintf("%s@%d", v.Key, v.CommitTs)] = v.Seq
	}
	z := seq["z@50"]
	require.Equal(t, map[string]uint64{"z@50": z, "b@60": z + 1, "a@20": z + 2, "c@70": z + 3}, seq,
		"each version once, numbered by its first delivery")
}

// TestKeyGroupFindsRepeatsInSmallAndLargeGroups: a group reports each key
// new once, while it is a list and after it moved to a map, and a reset
// forgets them.
func TestKeyGroupFindsRepeatsInSmallAndLargeGroups(t *testing.T) {
	var g keyGroup
	for round := range 2 {
		for _, n := range []int{1, keyGroupScan, keyGroupScan + 1, 3 * keyGroupScan} {
			g.reset()
			for i := range n {
				require.True(t, g.add(fmt.Appendf(nil, "k%d", i)), "round %d, %d keys: key %d is new", round, n, i)
			}
			for i := range n {
				require.False(t, g.add(fmt.Appendf(nil, "k%d", i)), "round %d, %d keys: key %d again", round, n, i)
			}
			require.True(t, g.add([]byte("k")), "a prefix of the keys is another key")
		}
	}
}

// TestApplyRowsNeverWritesIntoTheCallersRows: the sink keeps a first
// call's rows without a copy (the Sink contract allows it), but a later
// call's rows never land in the spare capacity of the caller's slice.
func TestApplyRowsNeverWritesIntoTheCallersRows(t *testing.T) {
	s := openTestSink(t)
	id := common.DispatcherIDFromUint64(1)
	s.Bind(id, 1)
	row := func(key string, ts common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte(key), CommitTs: ts}
	}
	buf := []common.Row{row("a", 10), row("untouched", 99)}
	require.NoError(t, s.ApplyRows(id, buf[:1]))
	require.NoError(t, s.ApplyRows(id, []common.Row{row("b", 11)}))
	require.Equal(t, row("untouched", 99), buf[1], "the caller's slice was written past the rows it gave")
	require.NoError(t, s.Checkpoint(id, 20))
	v, err := s.Versions(1)
	require.NoError(t, err)
	require.Len(t, v, 2)
}

// TestACheckpointBatchIsMadeAtItsSize: a checkpoint batch is made large
// enough for what it will hold (growing it copies all of it: tens of MiB
// in a collector process's batches) and not far larger, with rows given
// in several calls, keys with zero bytes (escaped, so longer in the key)
// and a DDL beside them, and then with no rows at all.
func TestACheckpointBatchIsMadeAtItsSize(t *testing.T) {
	s := openTestSink(t)
	var cps []eventcollector.SinkCheckpoint
	ts := common.Ts(10)
	for d := range 8 {
		id := common.DispatcherIDFromUint64(uint64(d + 1))
		s.Bind(id, int64(d+1))
		for call := range 3 {
			var rows []common.Row
			for r := range 50 {
				ts++
				key := fmt.Appendf(nil, "key-%d-%d", call, r)
				if r%2 == 0 {
					key = append(key, 0, 0, 0)
				}
				rows = append(rows, common.Row{Op: common.OpPut, Key: key, Value: bytes.Repeat([]byte{byte(r)}, 100), CommitTs: ts})
			}
			require.NoError(t, s.ApplyRows(id, rows))
		}
		require.NoError(t, s.ApplyDDL(id, &messaging.DDL{CommitTs: ts, Query: "ALTER TABLE t ADD COLUMN c INT"}))
		cps = append(cps, eventcollector.SinkCheckpoint{ID: id, Ts: ts})
	}
	errs := make([]error, len(cps))
	s.CheckpointBatch(cps, errs)
	for _, err := range errs {
		require.NoError(t, err)
	}
	s.mu.Lock()
	made, held := s.mu.lastBatch.made, s.mu.lastBatch.held
	s.mu.Unlock()
	require.Positive(t, held)
	require.GreaterOrEqual(t, made, held, "the batch had to grow")
	require.LessOrEqual(t, made, held*5/4, "the batch was made far larger than it needed")

	// Checkpoints alone, the batches of a quiet changefeed (a resolved-ts
	// advance of every dispatcher), are sized likewise.
	for i := range cps {
		cps[i].Ts++
	}
	clear(errs)
	s.CheckpointBatch(cps, errs)
	for _, err := range errs {
		require.NoError(t, err)
	}
	s.mu.Lock()
	made, held = s.mu.lastBatch.made, s.mu.lastBatch.held
	s.mu.Unlock()
	require.GreaterOrEqual(t, made, held, "a batch of checkpoints alone had to grow")
	require.LessOrEqual(t, made, held*5/4, "a batch of checkpoints alone was made far larger than it needed")
}

// TestCheckpointsSurviveTheLogsCutAndAReopen: checkpoints enough for the
// log to be cut into a snapshot, then more into a new log; a reopened
// sink reads every dispatcher's last checkpoint back, and the cut deleted
// the log it replaced.
func TestCheckpointsSurviveTheLogsCutAndAReopen(t *testing.T) {
	const dispatchers = snapshotChunk + 904 // a snapshot of two chunks
	// The log is cut at the first round that takes it to logCutMin; two
	// rounds follow.
	cutAt := (logCutMin + dispatchers - 1) / dispatchers
	rounds := cutAt + 2
	dir := t.TempDir()
	s, err := Open(dir)
	require.NoError(t, err)
	cps := make([]eventcollector.SinkCheckpoint, dispatchers)
	errs := make([]error, dispatchers)
	for i := range cps {
		cps[i].ID = common.DispatcherIDFromUint64(uint64(i + 1))
		s.Bind(cps[i].ID, int64(i+1))
	}
	for r := range rounds {
		for i := range cps {
			cps[i].Ts = common.Ts(r*10 + i%7 + 1)
		}
		clear(errs)
		s.CheckpointBatch(cps, errs)
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
	countKeys := func(kind byte) int {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kind}, UpperBound: []byte{kind + 1}})
		require.NoError(t, err)
		defer it.Close()
		n := 0
		for ok := it.First(); ok; ok = it.Next() {
			n++
		}
		return n
	}
	require.Equal(t, (dispatchers+snapshotChunk-1)/snapshotChunk, countKeys('C'), "one snapshot, in chunks")
	require.Equal(t, 2, countKeys('k'), "the cut deleted the log it replaced; the rounds after it are the new log")
	require.NoError(t, s.Close())

	s, err = Open(dir)
	require.NoError(t, err)
	defer s.Close()
	for i, cp := range cps {
		got, err := s.CheckpointOf(cp.ID)
		require.NoError(t, err)
		require.Equal(t, cp.Ts, got, "dispatcher %d", i)
	}
	got, err := s.CheckpointOf(common.DispatcherIDFromUint64(dispatchers + 1))
	require.NoError(t, err)
	require.Zero(t, got, "never checkpointed")
}

// TestACorruptCheckpointEntryFailsOpen: a log entry or snapshot chunk that
// is not whole (dispatcher, ts) pairs is ErrCorruptSink at Open, not a
// checkpoint made up.
func TestACorruptCheckpointEntryFailsOpen(t *testing.T) {
	for _, c := range []struct {
		key   []byte
		value int
	}{
		{logKey(3), checkpointEntryBytes + 1},      // a torn pair
		{snapshotKey(0), checkpointEntryBytes - 1}, // likewise
		{[]byte{'k', 1}, checkpointEntryBytes},     // a key of no log entry
		{[]byte{'C', 0, 0}, checkpointEntryBytes},  // a key of no chunk
	} {
		key := c.key
		dir := t.TempDir()
		s, err := Open(dir)
		require.NoError(t, err)
		require.NoError(t, s.db.Set(key, make([]byte, c.value), pebble.Sync))
		require.NoError(t, s.Close())
		_, err = Open(dir)
		require.ErrorIs(t, err, ErrCorruptSink, "key %x", key)
	}
}

// FuzzDecodeCheckpointEntry: any key and value either decode to whole
// (dispatcher, ts) pairs that encode back to the value, or are
// ErrCorruptSink with nothing set; never a panic.
func FuzzDecodeCheckpointEntry(f *testing.F) {
	var l checkpointLog
	l.add(common.DispatcherIDFromUint64(7), 9)
	l.add(common.DispatcherID{Hi: math.MaxUint64, Lo: 1}, math.MaxUint64)
	f.Add(logKey(0), bytes.Clone(l.batch))
	f.Add(snapshotKey(3), bytes.Clone(l.batch))
	f.Add([]byte{'k', 1}, bytes.Clone(l.batch))
	f.Add(logKey(1), l.batch[:checkpointEntryBytes+3])
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, k, v []byte) {
		var again checkpointLog
		err := decodeCheckpointEntry(k, v, func(id common.DispatcherID, ts common.Ts) { again.add(id, ts) })
		if err != nil {
			require.ErrorIs(t, err, ErrCorruptSink)
			require.Empty(t, again.batch, "a corrupt entry set checkpoints")
			return
		}
		require.Equal(t, len(v), len(again.batch))
		if len(v) > 0 {
			require.Equal(t, v, again.batch)
		}
	})
}
