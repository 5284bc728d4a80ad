package eventservice

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// inBackingArray reports whether p points into the backing array of s
// (its whole capacity).
func inBackingArray[T any](p unsafe.Pointer, s []T) bool {
	if cap(s) == 0 || p == nil {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	var zero T
	end := base + uintptr(cap(s))*unsafe.Sizeof(zero)
	return uintptr(p) >= base && uintptr(p) < end
}

// TestASmallScanTaskReadsRowsThatOwnTheirMemory: the rows a small scan task
// reads from the store, as scanner.read hands them to the send, own their
// memory: neither the Row structs nor their keys and values lie in the
// scan worker's shared row slab or byte arena, so a message waiting at a
// slow target pins nothing shared; and once the slab and the arena are in
// use, a small task gives back what it took of them (they are rewound to
// where it began). Two tasks run through the real read path on the real
// store, one after the other on the same scanner, as a scan worker runs
// them; the first task's rows are unchanged after the second.
func TestASmallScanTaskReadsRowsThatOwnTheirMemory(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	// A dispatcher of the service's own kind, registered in the store
	// only, so that no worker of the service owns its session: the test
	// is its scan worker.
	d := &dispatcher{id: common.DispatcherIDFromUint64(7), span: common.Pack(common.TableSpan(7)), svc: h.svc, target: h.targetFor(t)}
	s := newSession(d, 1, 10)
	notified := make(chan struct{}, 1)
	require.NoError(t, h.store.RegisterDispatcher(d.id, common.TableSpan(7), 10, eventstore.NotifierFunc(func(resolved, _ common.Ts) {
		storeMax(&d.received, uint64(resolved))
		select {
		case notified <- struct{}{}:
		default:
		}
	})))
	defer func() { require.NoError(t, h.store.UnregisterDispatcher(d.id)) }()
	sc := newScanner(h.svc)

	// task pushes rows and a resolved-ts for table 7, waits for the store
	// to notify it, and reads (resolved, resolved-ts] as a scan task.
	task := func(resolved common.Ts, rows ...common.Row) []messaging.Message {
		h.push(7, resolved, rows...)
		for common.Ts(d.received.Load()) < resolved {
			<-notified
		}
		read := sc.read(s)
		require.False(t, read.failed)
		require.False(t, read.cut)
		require.Equal(t, resolved, read.next.resolved)
		s.own.progress = read.next
		return append([]messaging.Message(nil), sc.msgs...)
	}
	// owned checks that the task's rows lie outside the scanner's shared
	// memory, and returns deep copies of them.
	owned := func(msgs []messaging.Message) []common.Row {
		var rows []common.Row
		for _, m := range msgs {
			dml, ok := m.(*messaging.DMLBatch)
			if !ok {
				continue
			}
			require.NotEmpty(t, dml.Rows)
			require.False(t, inBackingArray(unsafe.Pointer(unsafe.SliceData(dml.Rows)), sc.slab),
				"a small task's Row structs lie in the scan worker's shared slab")
			for _, r := range dml.Rows {
				require.False(t, inBackingArray(unsafe.Pointer(unsafe.SliceData(r.Key)), sc.arena.buf),
					"row %q's key lies in the scan worker's shared arena", r.Key)
				require.False(t, inBackingArray(unsafe.Pointer(unsafe.SliceData(r.Value)), sc.arena.buf),
					"row %q's value lies in the scan worker's shared arena", r.Key)
				rows = append(rows, r.Clone())
			}
		}
		return rows
	}

	first := task(30, row("a", 19, 20), row("b", 20, 21))
	firstRows := owned(first)
	require.Equal(t, []string{"a", "b"}, keys(firstRows))
	require.Positive(t, cap(sc.slab), "the task's rows went through the shared slab")
	require.Positive(t, cap(sc.arena.buf), "and the shared arena")
	sc.reset() // the send took the messages

	slabLen, arenaLen := len(sc.slab), len(sc.arena.buf)
	second := task(50, row("c", 34, 35), row("d", 35, 36), row("e", 35, 37))
	require.Equal(t, []string{"c", "d", "e"}, keys(owned(second)))
	require.Equal(t, slabLen, len(sc.slab), "the small task gave back its part of the slab")
	require.Equal(t, arenaLen, len(sc.arena.buf), "the small task gave back its part of the arena")
	sc.reset()

	// The first task's messages are as read: nothing the scanner did since
	// wrote into their memory.
	require.Equal(t, firstRows, owned(first))
}
