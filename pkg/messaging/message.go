package messaging

import (
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Kind is the type of a message.
type Kind uint8

const (
	// KindHandshake opens an epoch.
	KindHandshake Kind = iota + 1
	// KindDMLBatch carries row changes.
	KindDMLBatch
	// KindDDL carries one schema change.
	KindDDL
	// KindResolved carries resolved-ts progress.
	KindResolved
	// KindResolvedBatch carries the resolved-ts progress of many
	// dispatchers of one target.
	KindResolvedBatch
)

// String returns the kind's name, or "kind(N)" for an unknown one.
func (k Kind) String() string {
	switch k {
	case KindHandshake:
		return "handshake"
	case KindDMLBatch:
		return "dml"
	case KindDDL:
		return "ddl"
	case KindResolved:
		return "resolved"
	case KindResolvedBatch:
		return "resolved_batch"
	default:
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
}

// Header says whom a message is for and where it sits in that dispatcher's
// stream. Messages embed it, so m.Seq etc. read directly.
type Header struct {
	Dispatcher common.DispatcherID
	// Registration is the registration the message belongs to; a receiver
	// applies only messages of its current registration of Dispatcher.
	Registration RegistrationID
	// Epoch is the registration's reset generation, starting at 1.
	Epoch uint64
	// Seq is the message's position within the epoch; see the package doc.
	Seq uint64
}

// MessageHeader returns h; promoted to every message type.
func (h Header) MessageHeader() Header { return h }

// Message is one of *Handshake, *DMLBatch, *DDL, *Resolved, *ResolvedBatch.
// The set is closed (an unexported method seals it), so receivers may
// type-switch exhaustively.
type Message interface {
	// MessageHeader returns the message's header: the zero Header for a
	// ResolvedBatch, whose entries carry one each.
	MessageHeader() Header
	// Kind returns the message's type.
	Kind() Kind
	// Size returns the approximate number of bytes the message occupies on
	// a wire: the header, fixed fields and payload. It is O(rows) for a
	// DMLBatch.
	Size() int
	// nonNil reports whether the message is a non-nil pointer; it seals the
	// interface and lets Send reject typed nils without reflection.
	nonNil() bool
}

// Approximate wire sizes used by Size.
const (
	headerSize  = 16 + 8 + 8 + 8 // dispatcher, registration, epoch, seq
	tsSize      = 8
	rowOverhead = 1 + 2*tsSize // op, start-ts, commit-ts
	slotSize    = 4
)

// Handshake opens an epoch: it is the first message of each epoch, at Seq 1,
// and tells the receiver the epoch's start-ts (rows with commit-ts <= StartTs
// are not sent in this epoch).
type Handshake struct {
	Header
	StartTs common.Ts
	// Slot is the service's index of the dispatcher (zero: none), which
	// the receiver echoes in its heartbeats (DispatcherCheckpoint.Slot) so
	// the service finds the dispatcher by index instead of by ID. The
	// receiver does not interpret it.
	Slot uint32
}

// DMLBatch carries rows of one dispatcher in commit-ts order: one or more
// whole transactions, possibly followed by the beginning of a transaction too
// large for one batch, or (a split large transaction) a fragment of one
// transaction.
type DMLBatch struct {
	Header
	Rows []common.Row
	// Partial reports that the batch's last transaction is not complete: it
	// continues in the next DMLBatch of this dispatcher. The receiver must
	// not consider that transaction, or its commit-ts, applied until a batch
	// with Partial == false ends it. The zero value, the common case, means
	// the batch ends at a transaction boundary.
	Partial bool
}

// CommitTsRange returns the commit-ts of the batch's first and last rows,
// which are its lowest and highest since rows are in commit-ts order. Both
// are zero for an empty batch.
func (m *DMLBatch) CommitTsRange() (first, last common.Ts) {
	if len(m.Rows) == 0 {
		return 0, 0
	}
	return m.Rows[0].CommitTs, m.Rows[len(m.Rows)-1].CommitTs
}

// CompleteThrough returns the highest commit-ts whose transactions are all
// complete once this batch (and its predecessors) are applied: the last
// row's commit-ts if the batch ends at a transaction boundary, otherwise the
// highest commit-ts of the batch below the partial transaction's (zero if
// there is none). Several transactions may share a commit-ts, so "below" is
// strict.
func (m *DMLBatch) CompleteThrough() common.Ts {
	_, last := m.CommitTsRange()
	if !m.Partial {
		return last
	}
	for i := len(m.Rows) - 1; i >= 0; i-- {
		if ts := m.Rows[i].CommitTs; ts < last {
			return ts
		}
	}
	return 0
}

// DDL carries one schema change of the dispatcher's table. It follows the
// DML of the same commit-ts.
type DDL struct {
	Header
	TableID  int64
	CommitTs common.Ts
	Query    string
}

// Resolved tells the receiver that every change of the dispatcher with
// commit-ts <= Ts has been sent. Its Seq is the seq of the last message sent
// (it does not increment it), so the receiver can detect a lost message even
// when only progress follows it.
type Resolved struct {
	Header
	Ts common.Ts
	// Slot is the receiver's slot of the dispatcher, as its registration
	// gave it (RegisterRequest.Slot), echoed so the receiver can find the
	// dispatcher by index instead of by ID. It is a hint: a receiver
	// checks that the dispatcher in the slot is the one named, and looks
	// it up by ID when it is not. Zero means none.
	Slot uint32
}

// MaxResolvedBatchEntries bounds a ResolvedBatch. It is TiCDC's figure for
// its batched resolved-ts (512 per destination), and keeps a batch near
// 26 KiB on the wire.
const MaxResolvedBatchEntries = 512

// Weight is what m counts against a bounded queue's capacity (an inbox's
// Capacity, a remote collector's credit): 1, or a ResolvedBatch's entries.
// Batching then changes how many sends carry the resolved-ts, not how many
// a queue holds: counting a batch as one would let a slow collector be
// handed 512 times more progress per slot, and the sender's resolved set,
// which coalesces what waits, would coalesce less.
func Weight(m Message) int {
	if b, ok := m.(*ResolvedBatch); ok {
		return len(b.Entries)
	}
	return 1
}

// WeightOf is the sum of msgs' weights.
func WeightOf(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		n += Weight(m)
	}
	return n
}

// ResolvedBatch carries resolved-ts progress of many dispatchers of one
// target in one message: each entry means what a Resolved alone would,
// and the batch means what its entries sent one after another in order
// would. A sender that batches the resolved-ts it would have sent
// consecutively keeps every ordering guarantee (each entry is for its own
// dispatcher, and the batch sits where they would have). It has 1 to
// MaxResolvedBatchEntries entries.
//
// A sender that reuses the entries' memory builds the batch with
// NewOwnedResolvedBatch, and its receiver calls Release once it no longer
// reads them.
type ResolvedBatch struct {
	Entries []Resolved
	// owner, if set, is told by Release that the receiver is done.
	owner Releaser
}

// Releaser owns memory a message refers to: Release tells it that a
// receiver no longer reads the message, so the owner may reuse the memory.
type Releaser interface{ Release() }

// NewOwnedResolvedBatch returns a batch of entries whose memory owner is
// released when the receiver calls Release: with a receiver that releases
// them, the sender reuses the entries instead of leaving them to the GC
// at a million advances a second.
func NewOwnedResolvedBatch(entries []Resolved, owner Releaser) *ResolvedBatch {
	return &ResolvedBatch{Entries: entries, owner: owner}
}

// Release is called by the batch's receiver once it no longer reads the
// entries: it releases the owner, if any, once, and drops the entries, so
// that a late reader of this message finds none rather than the owner's
// next use of the memory. A receiver that never calls it costs the owner
// only a reuse (the memory is left to the garbage collector). One receiver
// calls it; it is not safe for concurrent use.
func (m *ResolvedBatch) Release() {
	if m == nil || m.owner == nil {
		return
	}
	o := m.owner
	m.owner, m.Entries = nil, nil
	o.Release()
}

// MessageHeader implements Message: a batch has no header of its own.
func (m *ResolvedBatch) MessageHeader() Header { return Header{} }

var (
	_ Message = (*Handshake)(nil)
	_ Message = (*DMLBatch)(nil)
	_ Message = (*DDL)(nil)
	_ Message = (*Resolved)(nil)
	_ Message = (*ResolvedBatch)(nil)
)

// Kind implements Message.
func (m *Handshake) Kind() Kind { return KindHandshake }

// Kind implements Message.
func (m *DMLBatch) Kind() Kind { return KindDMLBatch }

// Kind implements Message.
func (m *DDL) Kind() Kind { return KindDDL }

// Kind implements Message.
func (m *Resolved) Kind() Kind { return KindResolved }

// Kind implements Message.
func (m *ResolvedBatch) Kind() Kind { return KindResolvedBatch }

// Size implements Message.
func (m *Handshake) Size() int { return headerSize + tsSize + slotSize }

// Size implements Message.
func (m *DMLBatch) Size() int {
	n := headerSize + 1 // + the Partial flag
	for i := range m.Rows {
		n += rowOverhead + m.Rows[i].Size()
	}
	return n
}

// Size implements Message.
func (m *DDL) Size() int { return headerSize + 8 + tsSize + len(m.Query) }

// Size implements Message.
func (m *Resolved) Size() int { return headerSize + tsSize + slotSize }

// Size implements Message.
func (m *ResolvedBatch) Size() int { return 2 + len(m.Entries)*(headerSize+tsSize+slotSize) }

func (m *Handshake) nonNil() bool     { return m != nil }
func (m *DMLBatch) nonNil() bool      { return m != nil }
func (m *DDL) nonNil() bool           { return m != nil }
func (m *Resolved) nonNil() bool      { return m != nil }
func (m *ResolvedBatch) nonNil() bool { return m != nil }

// Validate checks what can be checked of m on its own: a non-nil message,
// a non-zero dispatcher and registration, Epoch >= 1, Seq 1 for a Handshake, Seq >= 2 for a
// DMLBatch or DDL (they follow the handshake), Seq >= 1 for a Resolved; a
// DMLBatch has rows, each with a valid op and a non-zero commit-ts, in
// commit-ts order; a DDL has a non-negative table and a non-zero commit-ts.
// A ResolvedBatch has 1 to MaxResolvedBatchEntries entries; its entries
// are checked one by one with ValidateEntry (one bad entry does not make
// the others unusable), not here.
// Errors wrap ErrInvalidMessage. Transports do not call it (it is O(rows));
// receivers should.
func Validate(m Message) error {
	if m == nil || !m.nonNil() {
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if b, ok := m.(*ResolvedBatch); ok {
		if n := len(b.Entries); n == 0 || n > MaxResolvedBatchEntries {
			return fmt.Errorf("%w: resolved_batch of %d entries (1 to %d)", ErrInvalidMessage, n, MaxResolvedBatchEntries)
		}
		return nil
	}
	h := m.MessageHeader()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s for dispatcher %s registration %s epoch %d seq %d: %s",
			ErrInvalidMessage, m.Kind(), h.Dispatcher, h.Registration, h.Epoch, h.Seq, fmt.Sprintf(format, args...))
	}
	if h.Dispatcher.IsZero() {
		return bad("zero dispatcher id")
	}
	if h.Registration.IsZero() {
		return bad("zero registration id")
	}
	if h.Epoch == 0 {
		return bad("zero epoch")
	}
	switch v := m.(type) {
	case *Handshake:
		if h.Seq != 1 {
			return bad("handshake must have seq 1")
		}
	case *DMLBatch:
		if h.Seq < 2 {
			return bad("data must follow the handshake (seq >= 2)")
		}
		if len(v.Rows) == 0 {
			return bad("no rows")
		}
		var prev common.Ts
		for i := range v.Rows {
			r := &v.Rows[i]
			if !r.Op.Valid() {
				return bad("row %d: invalid %s", i, r.Op)
			}
			if r.CommitTs == 0 || r.CommitTs < prev {
				return bad("row %d: commit-ts %d is zero or below the previous row's %d", i, uint64(r.CommitTs), uint64(prev))
			}
			prev = r.CommitTs
		}
	case *DDL:
		if h.Seq < 2 {
			return bad("data must follow the handshake (seq >= 2)")
		}
		if v.TableID < 0 || v.CommitTs == 0 {
			return bad("table %d, commit-ts %d", v.TableID, uint64(v.CommitTs))
		}
	case *Resolved:
		if h.Seq < 1 {
			return bad("resolved before the handshake (seq 0)")
		}
	}
	return nil
}

// ValidateEntry checks one entry of a ResolvedBatch as Validate checks a
// Resolved.
func ValidateEntry(r *Resolved) error { return Validate(r) }
