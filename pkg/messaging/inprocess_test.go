package messaging

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

func res(seq uint64) Message { return &Resolved{Header: hdr(seq), Ts: common.Ts(seq)} }

func resN(from, n uint64) []Message {
	out := make([]Message, 0, n)
	for i := range n {
		out = append(out, res(from+i))
	}
	return out
}

func seqs(msgs []Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.MessageHeader().Seq
	}
	return out
}

func newTransport(t *testing.T, opts InProcessOptions, targets ...Target) (*InProcess, []*Inbox) {
	t.Helper()
	p, err := NewInProcess(opts)
	require.NoError(t, err)
	var inboxes []*Inbox
	for _, tg := range targets {
		in, err := p.Register(tg)
		require.NoError(t, err)
		inboxes = append(inboxes, in)
	}
	return p, inboxes
}

// rung reports whether the doorbell holds a token, taking it.
func rung(in *Inbox) bool {
	select {
	case <-in.Ready():
		return true
	default:
		return false
	}
}

func TestNewInProcessOptions(t *testing.T) {
	_, err := NewInProcess(InProcessOptions{Capacity: -1, MaxBytes: -1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "Capacity")
	require.Contains(t, err.Error(), "MaxBytes")

	// The default capacity is DefaultCapacity messages.
	p, in := newTransport(t, InProcessOptions{}, "a")
	require.NoError(t, p.Send("a", resN(1, DefaultCapacity)))
	require.ErrorIs(t, p.Send("a", resN(DefaultCapacity+1, 1)), ErrBusy)
	require.Equal(t, DefaultCapacity, in[0].Len())
	require.Zero(t, in[0].Bytes(), "no byte bound: sizes are not computed")
}

func TestRegisterUnregister(t *testing.T) {
	p, _ := newTransport(t, InProcessOptions{}, "a")
	_, err := p.Register("")
	require.ErrorIs(t, err, ErrInvalidTarget)
	_, err = p.Register("a")
	require.ErrorIs(t, err, ErrTargetExists)
	require.ErrorIs(t, p.Unregister("b"), ErrUnknownTarget)
	require.ErrorIs(t, p.Send("b", resN(1, 1)), ErrUnknownTarget)
	require.ErrorIs(t, p.Send("b", nil), ErrUnknownTarget, "an empty send still checks the target")
	require.NoError(t, p.Send("a", nil))
}

func TestSendAllOrNothingAtCapacity(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{Capacity: 4}, "a")
	in := ins[0]

	require.NoError(t, p.Send("a", resN(1, 3)))
	require.Equal(t, ErrBusy, p.Send("a", resN(4, 2)), "one slot left, two messages: refuse both")
	require.Equal(t, 3, in.Len())
	require.NoError(t, p.Send("a", resN(4, 1)), "exactly filling the queue is fine")
	require.Equal(t, 4, in.Len())
	// A receiver that does not drain keeps refusing the sender.
	for range 3 {
		require.ErrorIs(t, p.Send("a", resN(5, 1)), ErrBusy)
	}
	require.ErrorIs(t, p.Send("a", resN(5, 5)), ErrBatchTooLarge, "could never fit")

	require.Equal(t, []uint64{1, 2}, seqs(in.Drain(nil, 2)))
	require.NoError(t, p.Send("a", resN(5, 2)), "room again after draining")
	require.Equal(t, []uint64{3, 4, 5, 6}, seqs(in.Drain(nil, 0)), "nothing of the refused batches leaked in")
	require.Zero(t, in.Len())
}

func TestSendByteBound(t *testing.T) {
	// A Resolved is 52 bytes.
	p, ins := newTransport(t, InProcessOptions{Capacity: 10, MaxBytes: 110}, "a")
	in := ins[0]
	require.NoError(t, p.Send("a", resN(1, 2)))
	require.Equal(t, 104, in.Bytes())
	require.Equal(t, ErrBusy, p.Send("a", resN(3, 1)))
	require.Equal(t, ErrBusy, p.Send("a", resN(3, 3)), "beyond the bound while others are held: busy, not too large")
	require.Equal(t, 104, in.Bytes())
	require.Equal(t, 2, in.Len())

	require.Equal(t, []uint64{1}, seqs(in.Drain(nil, 1)))
	require.Equal(t, 52, in.Bytes())
	require.NoError(t, p.Send("a", resN(3, 1)))
	require.Equal(t, []uint64{2, 3}, seqs(in.Drain(nil, 0)))
	require.Zero(t, in.Bytes())
}

// TestSendOversizedAlone: a message (or batch) beyond MaxBytes is admitted
// alone into an empty inbox, never refused for good (a row can be larger
// than any bound); while others are held it is ErrBusy, Room waits until
// the inbox is empty (not merely at half), and it goes in then.
func TestSendOversizedAlone(t *testing.T) {
	// A Resolved is 52 bytes: one alone is beyond MaxBytes 40.
	p, ins := newTransport(t, InProcessOptions{Capacity: 10, MaxBytes: 40}, "a")
	in := ins[0]
	isClosed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	require.NoError(t, p.Send("a", resN(1, 1)), "an oversized message into an empty inbox")
	require.Equal(t, 52, in.Bytes())
	require.Equal(t, ErrBusy, p.Send("a", resN(2, 1)), "the oversized message is held alone")
	room := p.Room("a")
	require.False(t, isClosed(room))
	require.False(t, p.HasRoom("a"))
	require.Equal(t, []uint64{1}, seqs(in.Drain(nil, 0)))
	require.True(t, isClosed(room), "empty: room for the refused message")
	require.NoError(t, p.Send("a", resN(2, 1)))
	require.NoError(t, p.Send("a", nil), "an empty batch only checks the target")

	// A batch beyond the bound while one message is held, at a byte bound
	// where half would otherwise count as room.
	p, ins = newTransport(t, InProcessOptions{Capacity: 10, MaxBytes: 120}, "a")
	in = ins[0]
	require.NoError(t, p.Send("a", resN(1, 1)))
	require.Equal(t, ErrBusy, p.Send("a", resN(2, 3)), "156 bytes while 52 are held")
	room = p.Room("a")
	require.False(t, isClosed(room), "at half the bound, but the refused batch does not fit: no room yet")
	require.False(t, p.HasRoom("a"))
	require.NoError(t, p.Send("a", resN(2, 1)), "a message that fits still goes in")
	require.Equal(t, []uint64{1}, seqs(in.Drain(nil, 1)))
	require.False(t, isClosed(room), "52 bytes still held")
	require.Equal(t, []uint64{2}, seqs(in.Drain(nil, 1)))
	require.True(t, isClosed(room), "empty")
	require.True(t, p.HasRoom("a"))
	require.NoError(t, p.Send("a", resN(3, 3)), "the oversized batch goes in alone")
	require.Equal(t, 156, in.Bytes())
	require.Equal(t, ErrBusy, p.Send("a", resN(6, 1)))
	require.Equal(t, []uint64{3, 4, 5}, seqs(in.Drain(nil, 0)))
	require.Zero(t, in.Bytes())
	require.True(t, p.HasRoom("a"), "the refused need is forgotten once it was met")
	require.NoError(t, p.Send("a", resN(6, 1)))
	require.True(t, p.HasRoom("a"), "52 of 120 bytes, no refusal pending: room as before")

	// Capacity in messages still refuses for good.
	require.ErrorIs(t, p.Send("a", resN(8, 11)), ErrBatchTooLarge)
}

// FIFO against a model queue, with the ring wrapping and growing.
func TestFIFOAgainstModel(t *testing.T) {
	const capacity = 7
	p, ins := newTransport(t, InProcessOptions{Capacity: capacity}, "a")
	in := ins[0]
	r := rand.New(rand.NewPCG(3, 4))
	var model []uint64
	next := uint64(1)
	var buf []Message
	for range 2000 {
		if r.IntN(2) == 0 {
			n := uint64(1 + r.IntN(4))
			err := p.Send("a", resN(next, n))
			if len(model)+int(n) > capacity {
				require.ErrorIs(t, err, ErrBusy)
				continue
			}
			require.NoError(t, err)
			for i := range n {
				model = append(model, next+i)
			}
			next += n
		} else {
			k := r.IntN(5)
			buf = in.Drain(buf[:0], k)
			want := len(model)
			if k > 0 && k < want {
				want = k
			}
			require.Equal(t, model[:want], seqs(buf))
			model = model[want:]
		}
		require.Equal(t, len(model), in.Len())
		in.mu.Lock()
		require.LessOrEqual(t, len(in.mu.buf), capacity, "ring never grows beyond the capacity")
		in.mu.Unlock()
	}
	require.Greater(t, next, uint64(1000))
}

func TestSendRejectsNilMessages(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{}, "a")
	var typedNil *DDL
	require.ErrorIs(t, p.Send("a", []Message{res(1), nil}), ErrInvalidMessage)
	require.ErrorIs(t, p.Send("a", []Message{res(1), typedNil}), ErrInvalidMessage)
	require.Zero(t, ins[0].Len(), "all or nothing")
	require.False(t, rung(ins[0]))
}

func TestUnregisterKeepsAcceptedMessages(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{}, "a")
	in := ins[0]
	require.NoError(t, p.Send("a", resN(1, 2)))
	require.NoError(t, p.Unregister("a"))
	require.ErrorIs(t, p.Send("a", resN(3, 1)), ErrUnknownTarget)
	// A Send that had already looked the inbox up fails the same way.
	require.ErrorIs(t, in.enqueue(resN(3, 1)), ErrUnknownTarget)
	<-in.Done()

	got, err := in.Receive(context.Background(), nil, 0)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2}, seqs(got))
	_, err = in.Receive(context.Background(), nil, 0)
	require.ErrorIs(t, err, ErrClosed)

	// The name can be registered again, with a fresh inbox.
	in2, err := p.Register("a")
	require.NoError(t, err)
	require.NoError(t, p.Send("a", resN(9, 1)))
	require.Equal(t, 1, in2.Len())
	require.Zero(t, in.Len())
}

func TestCloseWakesReceiversAndRefuses(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{}, "a", "b")
	a, b := ins[0], ins[1]
	require.NoError(t, p.Send("a", resN(1, 2)))

	blocked := make(chan error, 1)
	go func() {
		_, err := b.Receive(context.Background(), nil, 0)
		blocked <- err
	}()
	p.Close()
	p.Close() // idempotent
	require.ErrorIs(t, <-blocked, ErrClosed, "a blocked receiver is woken")

	require.ErrorIs(t, p.Send("a", resN(3, 1)), ErrClosed)
	require.ErrorIs(t, p.Send("zzz", resN(3, 1)), ErrClosed)
	_, err := p.Register("c")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, p.Unregister("a"), ErrClosed)
	require.ErrorIs(t, a.enqueue(resN(3, 1)), ErrClosed)
	<-a.Done()

	// What was accepted before Close is still delivered.
	got, err := a.Receive(context.Background(), nil, 0)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 2}, seqs(got))
	_, err = a.Receive(context.Background(), nil, 0)
	require.ErrorIs(t, err, ErrClosed)
}

func TestDoorbellAndReceive(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{}, "a")
	in := ins[0]
	require.False(t, rung(in))
	require.NoError(t, p.Send("a", resN(1, 1)))
	require.NoError(t, p.Send("a", resN(2, 2)))
	require.True(t, rung(in), "rung by the sends")
	require.False(t, rung(in), "one token however many sends")

	// A partial drain leaves messages behind and re-rings for them.
	require.Equal(t, []uint64{1}, seqs(in.Drain(nil, 1)))
	require.True(t, rung(in))
	require.Equal(t, []uint64{2}, seqs(in.Drain(nil, 1)))
	require.True(t, rung(in))
	require.Equal(t, []uint64{3}, seqs(in.Drain(nil, 1)))
	require.False(t, rung(in), "empty: no token")
	require.Empty(t, in.Drain(nil, 0))

	// Receive waits for a send.
	got := make(chan []Message, 1)
	go func() {
		msgs, err := in.Receive(context.Background(), nil, 0)
		assert.NoError(t, err)
		got <- msgs
	}()
	require.NoError(t, p.Send("a", resN(4, 2)))
	require.Equal(t, []uint64{4, 5}, seqs(<-got))

	// Receive honours max and appends to dst.
	require.NoError(t, p.Send("a", resN(6, 3)))
	dst := []Message{res(99)}
	dst, err := in.Receive(context.Background(), dst, 2)
	require.NoError(t, err)
	require.Equal(t, []uint64{99, 6, 7}, seqs(dst))

	// Receive on an empty inbox returns when its context ends.
	require.Equal(t, []uint64{8}, seqs(in.Drain(nil, 0)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = in.Receive(ctx, nil, 0)
	require.ErrorIs(t, err, context.Canceled)
}

// Concurrent senders to one small inbox, retrying on ErrBusy: every message
// arrives once, each sender's in order, and each batch contiguous (a batch is
// accepted whole, so nothing of another sender can land inside it).
func TestConcurrentSendersOneTarget(t *testing.T) {
	const (
		senders   = 4
		perSender = 3000
	)
	type batchKey struct {
		d  common.DispatcherID
		id common.Ts
	}
	p, ins := newTransport(t, InProcessOptions{Capacity: 16}, "a")
	in := ins[0]
	batchSizes := make([]map[batchKey]int, senders) // each written by its sender only
	var wg sync.WaitGroup
	for s := range senders {
		batchSizes[s] = map[batchKey]int{}
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(s), 1))
			d := common.DispatcherIDFromUint64(uint64(s + 1))
			var batch []Message
			for seq, id := uint64(1), common.Ts(1); seq <= perSender; id++ {
				batch = batch[:0]
				for n := 1 + r.IntN(5); n > 0 && seq <= perSender; n-- {
					batch = append(batch, &Resolved{Header: Header{Dispatcher: d, Epoch: 1, Seq: seq}, Ts: id})
					seq++
				}
				batchSizes[s][batchKey{d, id}] = len(batch)
				for {
					err := p.Send("a", batch)
					if err == nil {
						break
					}
					if !assert.ErrorIs(t, err, ErrBusy) {
						return
					}
					runtime.Gosched() // back off until the receiver drains
				}
			}
		})
	}

	lastSeq := map[common.DispatcherID]uint64{}
	var order []batchKey
	var got []Message
	for len(order) < senders*perSender {
		var err error
		got, err = in.Receive(context.Background(), got[:0], 0)
		require.NoError(t, err)
		for _, m := range got {
			r := m.(*Resolved)
			require.Equal(t, lastSeq[r.Dispatcher]+1, r.Seq, "sender %s", r.Dispatcher)
			lastSeq[r.Dispatcher] = r.Seq
			order = append(order, batchKey{r.Dispatcher, r.Ts})
		}
	}
	wg.Wait()
	require.Zero(t, in.Len())

	// Cut the received stream into runs of one batch; each run must be the
	// whole batch, and no batch may appear in two runs.
	runs := map[batchKey]int{}
	for i := 0; i < len(order); {
		j := i
		for j < len(order) && order[j] == order[i] {
			j++
		}
		k := order[i]
		_, seen := runs[k]
		require.False(t, seen, "batch %v split", k)
		runs[k] = j - i
		i = j
	}
	total := 0
	for s := range senders {
		for k, n := range batchSizes[s] {
			require.Equal(t, n, runs[k], "batch %v", k)
			total++
		}
	}
	require.Len(t, runs, total)
}

// Steady-state Send and Drain allocate nothing, refusals included.
func TestSendDoesNotAllocate(t *testing.T) {
	for _, maxBytes := range []int{0, 1 << 20} {
		p, ins := newTransport(t, InProcessOptions{Capacity: 64, MaxBytes: maxBytes}, "a")
		in := ins[0]
		batch := resN(1, 8)
		buf := make([]Message, 0, 64)
		allocs := testing.AllocsPerRun(100, func() {
			if err := p.Send("a", batch); err != nil {
				panic(err)
			}
			buf = in.Drain(buf[:0], 0)
			rung(in)
		})
		require.Zero(t, allocs, "maxBytes %d", maxBytes)

		require.NoError(t, p.Send("a", resN(1, 64)))
		allocs = testing.AllocsPerRun(100, func() {
			if err := p.Send("a", batch); err != ErrBusy {
				panic(err)
			}
		})
		require.Zero(t, allocs, "refusal, maxBytes %d", maxBytes)
	}
}

// TestRoomWakesARefusedSender: a sender refused by a full inbox gets a
// channel that closes when the receiver drains the inbox to half its
// capacity (not before), at once when there is room already, and when the
// target goes away.
func TestRoomWakesARefusedSender(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{Capacity: 4}, "a")
	in := ins[0]
	require.NoError(t, p.Send("a", resN(1, 4)))
	require.Equal(t, ErrBusy, p.Send("a", resN(5, 1)))
	room := p.Room("a")
	isClosed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	require.False(t, isClosed(room), "full: no room")
	require.False(t, p.HasRoom("a"))
	in.Drain(nil, 1)
	require.False(t, isClosed(room), "3 of 4: not yet")
	require.False(t, p.HasRoom("a"), "HasRoom answers as Room does")
	in.Drain(nil, 1)
	require.True(t, isClosed(room), "2 of 4: half, room")
	require.True(t, p.HasRoom("a"))
	require.True(t, isClosed(p.Room("a")), "room now: closed at once")
	require.True(t, isClosed(p.Room("nobody")), "an unknown target: closed at once (Send says why)")
	require.True(t, p.HasRoom("nobody"))

	require.NoError(t, p.Send("a", resN(7, 2)))
	room = p.Room("a")
	require.False(t, isClosed(room))
	require.False(t, p.HasRoom("a"))
	require.NoError(t, p.Unregister("a"))
	require.True(t, isClosed(room), "the target went away")
	require.True(t, p.HasRoom("a"))
}

// TestResolvedBatchCountsItsEntriesAgainstCapacity: a ResolvedBatch takes
// as much of an inbox's Capacity as its entries sent one by one would, so
// batching cannot hand a slow receiver more progress than its bound.
func TestResolvedBatchCountsItsEntriesAgainstCapacity(t *testing.T) {
	batch := func(n int) Message {
		b := &ResolvedBatch{Entries: make([]Resolved, n)}
		for i := range b.Entries {
			b.Entries[i] = Resolved{Header: hdr(uint64(i + 1)), Ts: 10}
		}
		return b
	}
	p, ins := newTransport(t, InProcessOptions{Capacity: 4}, "a")
	in := ins[0]
	require.Equal(t, 3, Weight(batch(3)))
	require.Equal(t, 1, Weight(res(1)))
	require.Equal(t, 4, WeightOf([]Message{batch(3), res(1)}))
	require.ErrorIs(t, p.Send("a", []Message{batch(5)}), ErrBatchTooLarge, "more entries than the capacity")
	require.NoError(t, p.Send("a", []Message{batch(3)}))
	require.Equal(t, 3, in.Len())
	require.Equal(t, ErrBusy, p.Send("a", []Message{batch(2)}), "3 + 2 entries exceed 4")
	require.NoError(t, p.Send("a", resN(1, 1)))
	require.Equal(t, ErrBusy, p.Send("a", resN(2, 1)))
	require.Len(t, in.Drain(nil, 1), 1)
	require.Equal(t, 1, in.Len(), "draining the batch frees its entries")
	require.NoError(t, p.Send("a", []Message{batch(3)}))
}
