package eventcollector

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// waitTimeout only turns a hang into a failure; no test waits on time for
// synchronisation.
const waitTimeout = 30 * time.Second

const testTarget messaging.Target = "collector-test"

// t0 is the fake clocks' starting instant.
var t0 = time.UnixMilli(1_700_000_000_000)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func did(n uint64) common.DispatcherID { return common.DispatcherIDFromUint64(n) }

type resetCallForTest struct {
	id      common.DispatcherID
	epoch   uint64
	startTs common.Ts
}

type heartbeatCallForTest struct {
	id         common.DispatcherID
	epoch      uint64
	checkpoint common.Ts
}

// recordingServiceForTest is a messaging.ControlPlane test double: it
// records every call and answers with the errors the test queued (nil when
// none). A heartbeat entry is answered with the code of the next queued
// heartbeat error (CodeOK when none).
type recordingServiceForTest struct {
	resetCh     chan resetCallForTest
	heartbeatCh chan heartbeatCallForTest

	mu            sync.Mutex
	registers     []messaging.RegisterRequest
	removes       []messaging.RemoveRequest
	resets        []resetCallForTest
	heartbeats    []heartbeatCallForTest
	heartbeatSlot []uint32 // heartbeatSlot[i] is the slot heartbeats[i] echoed
	heartbeatReqs int
	batches       []int                                // the sizes of the RegisterBatch calls
	refuseEntry   func(messaging.RegisterRequest) bool // Register and RegisterBatch refuse these entries (limit exceeded)
	registerErr   error
	removeErr     error
	resetErrs     []error // consumed in order by Reset
	heartbeatErrs []error // consumed in order by heartbeat entries
	// heartbeatCallErrs fail whole heartbeat calls, in order (a link
	// that broke: nothing of the call is recorded or applied).
	heartbeatCallErrs []error
}

var _ messaging.ControlPlane = (*recordingServiceForTest)(nil)

func newRecordingService() *recordingServiceForTest {
	return &recordingServiceForTest{resetCh: make(chan resetCallForTest, 256), heartbeatCh: make(chan heartbeatCallForTest, 256)}
}

func (s *recordingServiceForTest) Register(_ context.Context, req messaging.RegisterRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuseEntry != nil && s.refuseEntry(req) {
		return fmt.Errorf("%w: the test's service refuses %v", messaging.ErrLimitExceeded, req.Dispatcher)
	}
	s.registers = append(s.registers, req)
	return s.registerErr
}

func (s *recordingServiceForTest) Reset(_ context.Context, req messaging.ResetRequest) error {
	s.mu.Lock()
	c := resetCallForTest{req.Dispatcher, req.Epoch, req.StartTs}
	s.resets = append(s.resets, c)
	var err error
	if len(s.resetErrs) > 0 {
		err, s.resetErrs = s.resetErrs[0], s.resetErrs[1:]
	}
	s.mu.Unlock()
	s.resetCh <- c
	return err
}

func (s *recordingServiceForTest) Remove(_ context.Context, req messaging.RemoveRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removes = append(s.removes, req)
	return s.removeErr
}

func (s *recordingServiceForTest) RegisterBatch(ctx context.Context, r messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	s.mu.Lock()
	s.batches = append(s.batches, len(r.Requests))
	s.mu.Unlock()
	return messaging.RegisterEach(ctx, s.Register, r)
}

func (s *recordingServiceForTest) Heartbeat(_ context.Context, req messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	reply := messaging.HeartbeatReply{Codes: make([]messaging.Code, len(req.Checkpoints))}
	calls := make([]heartbeatCallForTest, len(req.Checkpoints))
	s.mu.Lock()
	s.heartbeatReqs++
	if len(s.heartbeatCallErrs) > 0 {
		err := s.heartbeatCallErrs[0]
		s.heartbeatCallErrs = s.heartbeatCallErrs[1:]
		s.mu.Unlock()
		return messaging.HeartbeatReply{}, err
	}
	for i, cp := range req.Checkpoints {
		calls[i] = heartbeatCallForTest{cp.Dispatcher, cp.Epoch, cp.Ts}
		s.heartbeatSlot = append(s.heartbeatSlot, cp.Slot)
		if len(s.heartbeatErrs) > 0 {
			reply.Codes[i] = messaging.CodeOf(s.heartbeatErrs[0])
			s.heartbeatErrs = s.heartbeatErrs[1:]
		}
	}
	s.heartbeats = append(s.heartbeats, calls...)
	s.mu.Unlock()
	for _, c := range calls {
		s.heartbeatCh <- c
	}
	return reply, nil
}

func (s *recordingServiceForTest) resetCalls() []resetCallForTest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]resetCallForTest(nil), s.resets...)
}

// nextReset waits for the next Reset call.
func (s *recordingServiceForTest) nextReset(t *testing.T) resetCallForTest {
	t.Helper()
	select {
	case c := <-s.resetCh:
		return c
	case <-time.After(waitTimeout):
		t.Fatal("timed out waiting for a Reset call")
		return resetCallForTest{}
	}
}

// craftedForTest is a collector fed crafted messages through a real
// in-process inbox, talking to a recording service, with a fake clock.
type craftedForTest struct {
	t       *testing.T
	inproc  *messaging.InProcess
	svc     *recordingServiceForTest
	sink    *MemorySink
	clk     *clock.Fake
	coll    *Collector
	handled chan messaging.Message
	ticks   chan struct{}
	done    chan struct{}
}

// newCrafted starts a collector. wrap, if set, wraps the memory sink.
func newCrafted(t *testing.T, wrap func(Sink) Sink, tweak func(*Options)) *craftedForTest {
	t.Helper()
	h := &craftedForTest{t: t, svc: newRecordingService(), sink: NewMemorySink(), clk: clock.NewFake(t0),
		handled: make(chan messaging.Message, 1024), ticks: make(chan struct{}, 64), done: make(chan struct{})}
	var err error
	h.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: 1024})
	require.NoError(t, err)
	inbox, err := h.inproc.Register(testTarget)
	require.NoError(t, err)
	var sink Sink = h.sink
	if wrap != nil {
		sink = wrap(sink)
	}
	opts := Options{Service: h.svc, Inbox: inbox, Sink: sink, Clock: h.clk, HeartbeatInterval: time.Second}
	if tweak != nil {
		tweak(&opts)
	}
	h.coll, err = New(opts)
	require.NoError(t, err)
	h.coll.knobs.registration = craftedReg
	h.coll.knobs.afterHandle = func(m messaging.Message) {
		select {
		case h.handled <- m:
		case <-h.done:
		}
	}
	h.coll.knobs.afterTick = func() {
		select {
		case h.ticks <- struct{}{}:
		case <-h.done:
		}
	}
	require.NoError(t, h.coll.Start())
	t.Cleanup(func() {
		close(h.done)
		require.NoError(t, h.coll.Close())
		h.inproc.Close()
	})
	return h
}

// deliver sends msgs and waits until the collector handled all of them.
func (h *craftedForTest) deliver(msgs ...messaging.Message) {
	h.t.Helper()
	require.NoError(h.t, h.inproc.Send(testTarget, msgs))
	for range msgs {
		select {
		case <-h.handled:
		case <-time.After(waitTimeout):
			h.t.Fatal("timed out waiting for the collector to handle a message")
		}
	}
}

// tick advances the fake clock by one heartbeat interval and waits for the
// heartbeat round to finish.
func (h *craftedForTest) tick() {
	h.t.Helper()
	h.clk.Advance(h.coll.opts.HeartbeatInterval)
	select {
	case <-h.ticks:
	case <-time.After(waitTimeout):
		h.t.Fatal("timed out waiting for a heartbeat round")
	}
}

func (h *craftedForTest) status(id common.DispatcherID) DispatcherStatus {
	h.t.Helper()
	st, err := h.coll.Dispatcher(id)
	require.NoError(h.t, err)
	return st
}

// Crafted messages.

// craftedReg is the registration the crafted collector gives dispatcher id
// (knobs.registration), so crafted messages can carry it.
func craftedReg(id common.DispatcherID) messaging.RegistrationID {
	return messaging.RegistrationID(id.Lo<<8 | 1)
}

func hdr(id common.DispatcherID, epoch, seq uint64) messaging.Header {
	return messaging.Header{Dispatcher: id, Registration: craftedReg(id), Epoch: epoch, Seq: seq}
}

func handshake(id common.DispatcherID, epoch uint64, startTs common.Ts) *messaging.Handshake {
	return &messaging.Handshake{Header: hdr(id, epoch, 1), StartTs: startTs}
}

func dml(id common.DispatcherID, epoch, seq uint64, partial bool, rows ...common.Row) *messaging.DMLBatch {
	return &messaging.DMLBatch{Header: hdr(id, epoch, seq), Rows: rows, Partial: partial}
}

func ddl(id common.DispatcherID, epoch, seq uint64, commitTs common.Ts) *messaging.DDL {
	return &messaging.DDL{Header: hdr(id, epoch, seq), TableID: 1, CommitTs: commitTs, Query: "alter"}
}

func resolved(id common.DispatcherID, epoch, seq uint64, ts common.Ts) *messaging.Resolved {
	return &messaging.Resolved{Header: hdr(id, epoch, seq), Ts: ts}
}

func row(key string, startTs, commitTs common.Ts) common.Row {
	return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte("v:" + key), StartTs: startTs, CommitTs: commitTs}
}

func keys(rows []common.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = string(r.Key)
	}
	return out
}
