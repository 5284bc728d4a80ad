package eventcollector

import (
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// ResetReason says why the collector reset a dispatcher. The set is closed
// and small, so it is safe as a metric label.
type ResetReason uint8

const (
	// ResetGap: a DML or DDL whose seq is not the next one, or a resolved-ts
	// whose seq is ahead of the last message received: a message was lost.
	ResetGap ResetReason = iota
	// ResetEpoch: a message of an epoch above the current one.
	ResetEpoch
	// ResetBeforeHandshake: data or a resolved-ts of the current epoch
	// before its handshake.
	ResetBeforeHandshake
	// ResetDuplicateHandshake: a second handshake in the current epoch.
	ResetDuplicateHandshake
	// ResetInvalid: a malformed message (messaging.Validate), rows or a DDL
	// out of commit-ts order or at or below the resolved-ts, or a handshake
	// starting above the requested start-ts (rows would be skipped).
	ResetInvalid
	// ResetSinkError: the sink returned an error.
	ResetSinkError
	numResetReasons
)

// String returns the reason's metric label.
func (r ResetReason) String() string {
	switch r {
	case ResetGap:
		return "gap"
	case ResetEpoch:
		return "epoch"
	case ResetBeforeHandshake:
		return "before_handshake"
	case ResetDuplicateHandshake:
		return "duplicate_handshake"
	case ResetInvalid:
		return "invalid"
	case ResetSinkError:
		return "sink_error"
	default:
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
}

// verdictKind is what the collector must do with a received message.
type verdictKind uint8

const (
	// verdictNone: nothing (a resolved-ts that does not move the
	// checkpoint: not above the last one, or inside a split transaction).
	verdictNone verdictKind = iota
	// verdictStale: an older epoch's leftover, or a resolved-ts overtaken
	// by later messages; ignored and counted.
	verdictStale
	// verdictBegin: a handshake was accepted; call Sink.BeginEpoch.
	verdictBegin
	// verdictRows: call Sink.ApplyRows.
	verdictRows
	// verdictDDL: call Sink.ApplyDDL.
	verdictDDL
	// verdictCheckpoint: call Sink.Checkpoint(ts), then checkpointed(ts).
	verdictCheckpoint
	// verdictReset: the stream moved to a new epoch; tell the service.
	verdictReset
)

// callsSink reports whether the verdict asks for a sink call.
func (k verdictKind) callsSink() bool {
	switch k {
	case verdictBegin, verdictRows, verdictDDL, verdictCheckpoint:
		return true
	default:
		return false
	}
}

// op is the sink operation a verdict that calls the sink makes, for the
// sink-latency metric.
func (k verdictKind) op() sinkOp {
	switch k {
	case verdictRows:
		return opRows
	case verdictDDL:
		return opDDL
	case verdictCheckpoint:
		return opCheckpoint
	default:
		return opBegin
	}
}

// verdict is receive's answer.
type verdict struct {
	kind   verdictKind
	reason ResetReason    // for verdictReset
	ts     common.Ts      // for verdictBegin (start-ts) and verdictCheckpoint
	rows   []common.Row   // for verdictRows
	ddl    *messaging.DDL // for verdictDDL
}

// stream is one dispatcher's receive state: the synchronous core of the
// collector. It does no I/O, takes no lock and reads no clock; its owner
// (the Collector, under its mutex) feeds it messages and acts on verdicts.
//
// INVARIANT: checkpoint never decreases, and moves only to a resolved-ts of
// the current epoch received outside a split transaction. startTs is the
// checkpoint at the last reset (or the start-ts given at registration); a
// handshake may start at or below it, never above.
// INVARIANT: needReset => !handshaked: the service has not yet confirmed
// the current epoch, so no message of it has been accepted.
type stream struct {
	epoch   uint64
	startTs common.Ts
	// seq is the seq of the last handshake, DML or DDL accepted in the
	// epoch: the next DML or DDL must carry seq+1, a resolved-ts seq.
	seq uint64
	// resolved is the highest resolved-ts accepted in the epoch (the
	// handshake's start-ts at first).
	resolved common.Ts
	// checkpoint is the highest ts the sink confirmed with Checkpoint.
	checkpoint common.Ts
	// lastCommit and lastDDL are the commit-ts of the last row and the last
	// DDL accepted in the epoch, to check order.
	lastCommit, lastDDL common.Ts
	resets              uint64

	// The flags share a word (a collector's dispatcher then fits the
	// 128-byte size class, not 160). handshaked: the epoch's handshake
	// was accepted. partial: the last DML batch ended inside a
	// transaction. needReset: the epoch was bumped locally and the service
	// has not yet acknowledged it (Reset did not succeed, and no
	// handshake of it came).
	handshaked, partial, needReset bool
}

func newStream(startTs common.Ts) stream {
	return stream{epoch: 1, startTs: startTs, resolved: startTs, checkpoint: startTs}
}

// receive applies one message to the stream and says what to do. invalid
// reports that messaging.Validate refused the message. The rules are those
// of the package documentation.
func (s *stream) receive(m messaging.Message, invalid bool) verdict {
	h := m.MessageHeader()
	switch {
	case h.Epoch < s.epoch:
		return verdict{kind: verdictStale}
	case h.Epoch > s.epoch:
		return s.reset(ResetEpoch, h.Epoch)
	case invalid:
		return s.reset(ResetInvalid, 0)
	}
	if hs, ok := m.(*messaging.Handshake); ok {
		switch {
		case s.handshaked:
			return s.reset(ResetDuplicateHandshake, 0)
		case hs.StartTs > s.startTs:
			return s.reset(ResetInvalid, 0)
		}
		s.handshaked, s.needReset = true, false
		s.seq = h.Seq
		s.resolved, s.lastCommit, s.lastDDL, s.partial = hs.StartTs, hs.StartTs, 0, false
		return verdict{kind: verdictBegin, ts: hs.StartTs}
	}
	if !s.handshaked {
		return s.reset(ResetBeforeHandshake, 0)
	}
	switch v := m.(type) {
	case *messaging.DMLBatch:
		if h.Seq != s.seq+1 {
			return s.reset(ResetGap, 0)
		}
		first, last := v.CommitTsRange()
		if !s.inOrder(first) {
			return s.reset(ResetInvalid, 0)
		}
		s.seq, s.lastCommit, s.partial = h.Seq, last, v.Partial
		return verdict{kind: verdictRows, rows: v.Rows}
	case *messaging.DDL:
		if h.Seq != s.seq+1 {
			return s.reset(ResetGap, 0)
		}
		// A DDL inside a split transaction would precede some of the rows
		// of its commit-ts or lie above an incomplete transaction.
		if !s.inOrder(v.CommitTs) || s.partial {
			return s.reset(ResetInvalid, 0)
		}
		s.seq, s.lastDDL = h.Seq, v.CommitTs
		return verdict{kind: verdictDDL, ddl: v}
	case *messaging.Resolved:
		switch {
		case h.Seq < s.seq:
			return verdict{kind: verdictStale} // later messages were sent after it
		case h.Seq > s.seq:
			return s.reset(ResetGap, 0)
		case v.Ts <= s.resolved:
			return verdict{kind: verdictNone}
		}
		s.resolved = v.Ts
		if s.partial || v.Ts <= s.checkpoint {
			// The cut transaction is not applied yet; the resolved-ts that
			// follows its end moves the checkpoint.
			return verdict{kind: verdictNone}
		}
		return verdict{kind: verdictCheckpoint, ts: v.Ts}
	}
	return s.reset(ResetInvalid, 0) // the message set is closed; unreachable
}

// inOrder reports whether data at commit-ts ts may follow what the epoch
// accepted: above the resolved-ts (everything at or below it was sent),
// not below the last row (a split transaction continues at its commit-ts),
// and above the last DDL (which followed every row of its commit-ts).
func (s *stream) inOrder(ts common.Ts) bool {
	return ts > s.resolved && ts >= s.lastCommit && ts > s.lastDDL
}

// checkpointed records that the sink confirmed ts.
func (s *stream) checkpointed(ts common.Ts) {
	s.checkpoint = max(s.checkpoint, ts)
}

// reset starts a new epoch above both the current one and seen (an epoch
// the service was observed to use), from the checkpoint.
func (s *stream) reset(reason ResetReason, seen uint64) verdict {
	s.epoch = max(s.epoch, seen) + 1
	s.startTs = s.checkpoint
	s.handshaked, s.needReset, s.partial = false, true, false
	s.seq, s.resolved, s.lastCommit, s.lastDDL = 0, s.checkpoint, 0, 0
	s.resets++
	return verdict{kind: verdictReset, reason: reason}
}

// bumpEpoch moves a not yet acknowledged epoch one further, after the
// service refused it as stale (it already has that epoch or a newer one).
// REQUIRES: s.needReset.
func (s *stream) bumpEpoch() { s.epoch++ }
