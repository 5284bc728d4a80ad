package eventcollector

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// This file tests the synchronous core (stream) against an oracle: a model
// service produces a protocol-correct stream from any start-ts, a lossy
// channel drops, duplicates and reorders messages, and whatever happens,
// once the channel heals the sink holds exactly the source rows, every
// checkpoint was true when it was made, and no epoch applied a row twice.

// modelTxnForTest is one transaction of the source: rows at one commit-ts,
// optionally followed by a DDL at the same commit-ts.
type modelTxnForTest struct {
	commitTs common.Ts
	rows     []common.Row
	ddl      bool
}

func modelSource(r *rand.Rand, id common.DispatcherID) (txns []modelTxnForTest, final common.Ts) {
	ts := common.Ts(10)
	for i := range 30 {
		ts += common.Ts(1 + r.IntN(5))
		txn := modelTxnForTest{commitTs: ts, ddl: r.IntN(6) == 0}
		for k := range 1 + r.IntN(6) {
			txn.rows = append(txn.rows, row(fmt.Sprintf("%v-t%02d-k%d", id, i, k), ts-1, ts))
		}
		txns = append(txns, txn)
	}
	return txns, ts + 5
}

// modelStream is what a correct service sends in epoch from startTs:
// a handshake, then per transaction its rows (in fragments: all but the
// last Partial, sometimes a resolved-ts just below it in between, as the
// real scanner does), its DDL, and sometimes a resolved-ts, then a final
// resolved-ts. It returns the messages and the epoch's last seq.
func modelStream(r *rand.Rand, id common.DispatcherID, epoch uint64, startTs common.Ts, txns []modelTxnForTest, final common.Ts) ([]messaging.Message, uint64) {
	seq := uint64(1)
	out := []messaging.Message{handshake(id, epoch, startTs)}
	resolvedTs := startTs
	for _, txn := range txns {
		if txn.commitTs <= startTs {
			continue
		}
		rows := txn.rows
		for len(rows) > 0 {
			n := 1 + r.IntN(len(rows))
			seq++
			out = append(out, dml(id, epoch, seq, n < len(rows), rows[:n]...))
			rows = rows[n:]
			if len(rows) > 0 && r.IntN(3) == 0 && txn.commitTs-1 > resolvedTs {
				resolvedTs = txn.commitTs - 1
				out = append(out, resolved(id, epoch, seq, resolvedTs))
			}
		}
		if txn.ddl {
			seq++
			out = append(out, &messaging.DDL{Header: hdr(id, epoch, seq), TableID: 1, CommitTs: txn.commitTs, Query: "alter"})
		}
		if r.IntN(2) == 0 {
			resolvedTs = txn.commitTs
			out = append(out, resolved(id, epoch, seq, resolvedTs))
		}
	}
	return append(out, resolved(id, epoch, seq, final)), seq
}

// modelSinkForTest records per epoch, and checks every checkpoint.
type modelSinkForTest struct {
	t      *testing.T
	source []common.Row
	mem    *MemorySink
}

func (s *modelSinkForTest) checkpoint(id common.DispatcherID, ts common.Ts) {
	var want, got []string
	for _, r := range s.source {
		if r.CommitTs <= ts {
			want = append(want, rowID(r))
		}
	}
	for _, r := range s.mem.Deduplicated(id) {
		if r.CommitTs <= ts {
			got = append(got, rowID(r))
		}
	}
	require.Equal(s.t, want, got, "checkpoint %v", ts)
	require.NoError(s.t, s.mem.Checkpoint(id, ts))
}

func TestStreamOracle(t *testing.T) {
	for seed := range uint64(100) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runStreamOracle(t, seed) })
	}
}

func runStreamOracle(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	id := did(1)
	txns, final := modelSource(r, id)
	var source []common.Row
	for _, txn := range txns {
		source = append(source, txn.rows...)
	}
	sink := &modelSinkForTest{t: t, source: source, mem: NewMemorySink()}
	st := newStream(10)
	queue, lastSeq := modelStream(r, id, 1, 10, txns, final)
	var sent []messaging.Message // this epoch's messages, for stale replays
	faulty := true
	resets := 0
	for step := 0; ; step++ {
		require.Less(t, step, 100_000, "no convergence")
		if step == 2000 || resets > 40 {
			faulty = false // the channel heals
		}
		if len(queue) == 0 {
			if st.handshaked && st.checkpoint == final {
				break
			}
			// A later resolved-ts advance of the service's current epoch.
			queue = append(queue, resolved(id, st.epoch, lastSeq, final))
		}
		m := queue[0]
		queue = queue[1:]
		if faulty {
			switch x := r.IntN(100); {
			case x < 4:
				continue // dropped
			case x < 6:
				queue = append([]messaging.Message{m}, queue...) // duplicated
			case x < 9 && len(sent) > 0:
				queue = append([]messaging.Message{m}, queue...) // an older message overtakes it
				m = sent[r.IntN(len(sent))]
			}
		}
		sent = append(sent, m)
		v := st.receive(m, messaging.Validate(m) != nil)
		switch v.kind {
		case verdictBegin:
			require.NoError(t, sink.mem.BeginEpoch(id, st.epoch, v.ts))
		case verdictRows:
			if faulty && r.IntN(50) == 0 {
				v = st.reset(ResetSinkError, 0)
				break
			}
			require.NoError(t, sink.mem.ApplyRows(id, v.rows))
		case verdictDDL:
			require.NoError(t, sink.mem.ApplyDDL(id, v.ddl))
		case verdictCheckpoint:
			sink.checkpoint(id, v.ts)
			st.checkpointed(v.ts)
		}
		if v.kind == verdictReset {
			resets++
			require.Equal(t, st.checkpoint, st.startTs)
			// The service starts the new epoch; some of the old epoch's
			// messages are still in flight ahead of it.
			keep := queue[:r.IntN(len(queue)+1)]
			var next []messaging.Message
			next, lastSeq = modelStream(r, id, st.epoch, st.startTs, txns, final)
			queue = append(slices.Clone(keep), next...)
			sent = sent[:0]
		}
	}
	got := sink.mem.Deduplicated(id)
	t.Logf("resets %d, epochs %d", resets, len(sink.mem.Epochs(id)))
	require.Equal(t, rowIDs(source), rowIDs(got))
	assertEpochsClean(t, sink.mem.Epochs(id))
	var wantDDLs []common.Ts
	for _, txn := range txns {
		if txn.ddl {
			wantDDLs = append(wantDDLs, txn.commitTs)
		}
	}
	gotDDLs := map[common.Ts]bool{}
	for _, d := range sink.mem.AppliedDDLs(id) {
		gotDDLs[d.CommitTs] = true
	}
	require.Len(t, gotDDLs, len(wantDDLs))
	for _, ts := range wantDDLs {
		require.True(t, gotDDLs[ts], "ddl at %v", ts)
	}
}

func TestResetReasonNames(t *testing.T) {
	want := []string{"gap", "epoch", "before_handshake", "duplicate_handshake", "invalid", "sink_error"}
	for r := range numResetReasons {
		require.Equal(t, want[r], r.String())
	}
	require.Equal(t, "reason(99)", ResetReason(99).String())
}
