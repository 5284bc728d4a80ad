package remote

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Credit is tied to what the collector read. A grant says "my inbox has
// this much more room"; a peer can say that without reading anything, and
// if every grant were believed the service would queue, and write, more
// than the collector's capacity to a peer that never reads (one probe
// had 5,095 messages accepted against a capacity of 4,096, until the send
// stall was declared). So every data frame carries a mark, the stream's
// weight through that frame and a tag that only the server can compute (a
// keyed hash of the weight, its key drawn per stream), and every credit
// frame echoes the mark of the last data frame the collector read. The
// server believes the weight a valid mark names as read (acked), and no
// more: whatever is granted, what it has accepted and not seen read stays
// within the capacity,
//
//	accepted - acked <= capacity,
//
// because a Send is accepted only within min(granted, acked+capacity). A
// mark that is not one the server wrote (a forged or replayed tag) ends
// the stream as malformed. An honest collector loses nothing: it grants
// the room its inbox has, at most capacity beyond what it read, and echoes
// the mark of what it read when it grants.

// mark is a data frame's: the stream's weight through the frame, and its
// tag. The zero mark is a ping's, and a credit frame's before the
// collector read anything.
type mark struct {
	weight uint64
	tag    uint64
}

// maxMarkBytes is the most bytes a mark takes.
const maxMarkBytes = binary.MaxVarintLen64 + 8

func (e *encoder) mark(m mark) {
	e.u(m.weight)
	e.b = binary.BigEndian.AppendUint64(e.b, m.tag)
}

func (d *decoder) mark() mark { return mark{weight: d.u(), tag: d.U64("mark tag")} }

// markKey is a stream's secret: only the server can tag a weight with it.
type markKey [32]byte

// newMarkKey draws a stream's key (crypto/rand.Read does not fail).
func newMarkKey() *markKey {
	var k markKey
	_, _ = rand.Read(k[:])
	return &k
}

// mark returns the mark of weight: its tag is the first 8 bytes of
// SHA-256(key || weight), a fixed-length input, so it cannot be extended.
func (k *markKey) mark(weight uint64) mark {
	var in [len(markKey{}) + 8]byte
	copy(in[:], k[:])
	binary.BigEndian.PutUint64(in[len(k):], weight)
	sum := sha256.Sum256(in[:])
	return mark{weight: weight, tag: binary.BigEndian.Uint64(sum[:8])}
}

// ledger is a stream's flow control, in weight (messaging.Weight) since
// the stream opened. REQUIRES: its peer's mu held for every use.
type ledger struct {
	capacity uint64
	accepted uint64 // weight Send queued
	granted  uint64 // the opening credit plus every grant, at most accepted+capacity
	acked    uint64 // weight through the last frame the collector proved it read
}

// available is what a Send may still queue.
func (l *ledger) available() uint64 { return min(l.granted, l.acked+l.capacity) - l.accepted }

// inFlight is what was accepted and not seen read: at most the capacity.
func (l *ledger) inFlight() uint64 { return l.accepted - l.acked }

// grant applies a credit frame: the mark it echoes, then the credit. A
// grant beyond the capacity leaves the credit at the capacity.
func (l *ledger) grant(key *markKey, n uint32, m mark) error {
	if m != (mark{}) {
		if m.weight > l.accepted || key.mark(m.weight) != m {
			return fmt.Errorf("%w: a credit frame echoes a mark (weight %d) the service did not send (%d sent)", ErrMalformed, m.weight, l.accepted)
		}
		l.acked = max(l.acked, m.weight)
	}
	l.granted = min(l.granted+uint64(n), l.accepted+l.capacity)
	return nil
}
