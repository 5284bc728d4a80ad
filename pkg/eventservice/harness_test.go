package eventservice

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testTarget messaging.Target = "collector-1"

// harness is a service on the real pebble store, the manual upstream, the
// in-memory schema store and the in-process transport, wrapped in a
// switchable transport so tests can make the target refuse.
type harness struct {
	t      *testing.T
	up     *upstream.Manual
	store  *eventstore.Store
	schema *schemastore.Memory
	inproc *messaging.InProcess
	tr     *switchableTransportForTest
	svc    *Service
	check  *streamCheckerForTest
	gates  []*gateForTest
	closed bool
	// regs is each dispatcher's current registration; nextReg numbers
	// them (a fresh one per Register, as a collector does).
	regs    map[common.DispatcherID]messaging.RegistrationID
	nextReg messaging.RegistrationID
}

// newHarness starts a harness. gates are opened before the service is
// closed, so a failing test cannot leave a worker held forever.
func newHarness(t *testing.T, tweak func(*Options), hk hooks, gates ...*gateForTest) *harness {
	t.Helper()
	h := &harness{t: t, up: upstream.NewManual(), gates: gates, regs: map[common.DispatcherID]messaging.RegistrationID{}}
	var err error
	h.store, err = eventstore.Open(eventstore.Options{Upstream: h.up})
	require.NoError(t, err)
	require.NoError(t, h.store.Start())
	h.schema, err = schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	h.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: 1 << 16})
	require.NoError(t, err)
	inbox, err := h.inproc.Register(testTarget)
	require.NoError(t, err)
	h.tr = &switchableTransportForTest{inner: h.inproc, refused: make(chan struct{}, 1)}
	// zaptest: the service's logs appear only when a test fails.
	opts := Options{Store: h.store, Schema: h.schema, Transport: h.tr, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.DebugLevel))}
	if tweak != nil {
		tweak(&opts)
	}
	h.svc, err = New(opts)
	require.NoError(t, err)
	h.svc.knobs = hk.knobs()
	require.NoError(t, h.svc.Start())
	h.check = newStreamChecker(t, inbox)
	t.Cleanup(h.close)
	return h
}

func (h *harness) close() {
	if h.closed {
		return
	}
	h.closed = true
	for _, g := range h.gates {
		g.open()
	}
	require.NoError(h.t, h.svc.Close())
	require.NoError(h.t, h.store.Close())
	h.inproc.Close()
	h.check.assertClean()
}

// register registers dispatcher n on table n from startTs with testTarget.
func (h *harness) register(n uint64, startTs common.Ts) common.DispatcherID {
	h.t.Helper()
	id := common.DispatcherIDFromUint64(n)
	require.NoError(h.t, h.registerOn(id, int64(n), startTs, testTarget))
	return id
}

// registerOn registers id on table from startTs with target, as a new
// registration (the stream checker follows it from now on).
func (h *harness) registerOn(id common.DispatcherID, table int64, startTs common.Ts, target messaging.Target) error {
	h.nextReg++
	reg := h.nextReg
	undo := func() {}
	if target == testTarget {
		undo = h.check.expect(id, reg)
	}
	err := h.svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: id, Registration: reg,
		Span: common.TableSpan(table), StartTs: startTs, Target: target})
	if err != nil {
		undo()
		return err
	}
	h.regs[id] = reg
	return nil
}

// reset resets id's current registration to epoch from startTs.
func (h *harness) reset(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	return h.svc.Reset(context.Background(), messaging.ResetRequest{Dispatcher: id, Registration: h.regOf(id), Epoch: epoch, StartTs: startTs})
}

// remove removes id's current registration.
func (h *harness) remove(id common.DispatcherID) error {
	return h.svc.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: id, Registration: h.regOf(id)})
}

// heartbeat reports one checkpoint of id's current registration and
// returns the outcome of that entry (or of the call).
func (h *harness) heartbeat(id common.DispatcherID, epoch uint64, ts common.Ts) error {
	reply, err := h.svc.Heartbeat(context.Background(), messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
		{Dispatcher: id, Registration: h.regOf(id), Epoch: epoch, Ts: ts}}})
	if err != nil {
		return err
	}
	require.Len(h.t, reply.Codes, 1)
	return reply.Codes[0].Err()
}

// regOf returns id's current registration (1 for an ID never registered,
// which no test registration uses... except the first: tests asking about
// unknown IDs get ErrUnknownDispatcher before the registration matters).
func (h *harness) regOf(id common.DispatcherID) messaging.RegistrationID {
	if r, ok := h.regs[id]; ok {
		return r
	}
	return 1
}

// push pushes rows and a resolved-ts for table n; the schema frontier is
// advanced first unless the test manages it.
func (h *harness) push(n uint64, resolved common.Ts, rows ...common.Row) {
	h.t.Helper()
	require.NoError(h.t, h.up.Push(context.Background(), common.TableSpan(int64(n)), eventstore.Batch{Rows: rows, ResolvedTs: resolved}))
}

func (h *harness) advanceSchema(ts common.Ts) {
	h.t.Helper()
	if ts > h.schema.ResolvedTs() {
		require.NoError(h.t, h.schema.AdvanceResolvedTs(ts))
	}
}

func row(key string, startTs, commitTs common.Ts) common.Row {
	return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte("v:" + key), StartTs: startTs, CommitTs: commitTs}
}

// switchableTransportForTest forwards to the in-process transport unless
// refusing is on, in which case it answers ErrBusy (and signals the first
// refusal since the last drain of refused).
type switchableTransportForTest struct {
	inner   messaging.Transport
	refuse  atomic.Bool // refuse every target
	only    atomic.Pointer[messaging.Target]
	refused chan struct{}
	sends   atomic.Int64
}

// refuseOnly makes the transport refuse target to alone.
func (s *switchableTransportForTest) refuseOnly(to messaging.Target) { s.only.Store(&to) }

func (s *switchableTransportForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	s.sends.Add(1)
	if only := s.only.Load(); s.refuse.Load() || (only != nil && *only == to) {
		select {
		case s.refused <- struct{}{}:
		default:
		}
		return messaging.ErrBusy
	}
	return s.inner.Send(to, msgs)
}

// epochStream is what the checker saw of one dispatcher in one epoch.
type epochStream struct {
	epoch      uint64
	startTs    common.Ts
	seq        uint64
	resolved   common.Ts
	lastCommit common.Ts
	lastDDL    common.Ts
	rows       []common.Row
	ddls       []*messaging.DDL
	partial    bool
	partials   int // DMLBatch messages that ended inside a transaction
}

// streamCheckerForTest is a strict receiver: it checks every message
// against the protocol (handshake first, seq +1 per DML/DDL, resolved at
// the current seq and monotonic, rows in commit-ts order and never at or
// below a resolved-ts already received, DDLs after the rows of their
// commit-ts) and records what each dispatcher received.
type streamCheckerForTest struct {
	t       *testing.T
	inbox   *messaging.Inbox
	mu      sync.Mutex
	streams map[common.DispatcherID]*epochStream
	history map[common.DispatcherID][]*epochStream
	// stale counts handshakes, DMLs and DDLs of an older epoch that arrived
	// after a newer epoch's handshake (a collector ignores them; tests that
	// hold the old epoch's work across a reset assert there are none).
	stale map[common.DispatcherID]int
	// current is each dispatcher's current registration (expect); a
	// message of another registration is counted in staleReg and
	// otherwise ignored, as a collector does.
	current    map[common.DispatcherID]messaging.RegistrationID
	staleReg   map[common.DispatcherID]int
	violations []string
	buf        []messaging.Message
}

func newStreamChecker(t *testing.T, inbox *messaging.Inbox) *streamCheckerForTest {
	return &streamCheckerForTest{t: t, inbox: inbox, streams: map[common.DispatcherID]*epochStream{},
		history: map[common.DispatcherID][]*epochStream{}, stale: map[common.DispatcherID]int{},
		current: map[common.DispatcherID]messaging.RegistrationID{}, staleReg: map[common.DispatcherID]int{}}
}

// expect makes reg id's current registration: its stream starts afresh
// (messages already in the inbox are applied first, to the one before).
// The returned function goes back to the one before (a Register that
// failed).
func (c *streamCheckerForTest) expect(id common.DispatcherID, reg messaging.RegistrationID) (undo func()) {
	c.drain()
	c.mu.Lock()
	defer c.mu.Unlock()
	prevReg, hadReg := c.current[id]
	prevStream, hadStream := c.streams[id]
	c.current[id] = reg
	delete(c.streams, id)
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !hadReg {
			delete(c.current, id)
		} else {
			c.current[id] = prevReg
		}
		if hadStream {
			c.streams[id] = prevStream
		}
	}
}

func (c *streamCheckerForTest) violate(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// drain applies every message in the inbox; it never blocks.
func (c *streamCheckerForTest) drain() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = c.inbox.Drain(c.buf[:0], 0)
	for _, m := range c.buf {
		c.apply(m)
	}
	n := len(c.buf)
	clear(c.buf)
	return n
}

func (c *streamCheckerForTest) apply(m messaging.Message) {
	if b, ok := m.(*messaging.ResolvedBatch); ok {
		if err := messaging.Validate(b); err != nil {
			c.violate("%v", err)
		}
		for i := range b.Entries {
			c.apply(&b.Entries[i]) // as if sent one by one, in order
		}
		return
	}
	hd := m.MessageHeader()
	if hd.Registration != c.current[hd.Dispatcher] {
		c.staleReg[hd.Dispatcher]++
		return
	}
	st := c.streams[hd.Dispatcher]
	if hs, ok := m.(*messaging.Handshake); ok {
		if st != nil && hs.Epoch <= st.epoch {
			if hs.Epoch == st.epoch {
				c.violate("%v: second handshake in epoch %d", hd.Dispatcher, hs.Epoch)
			} else {
				c.stale[hd.Dispatcher]++
			}
			return
		}
		if hs.Seq != 1 {
			c.violate("%v: handshake seq %d", hd.Dispatcher, hs.Seq)
		}
		st = &epochStream{epoch: hs.Epoch, startTs: hs.StartTs, seq: 1, resolved: hs.StartTs, lastCommit: hs.StartTs}
		c.streams[hd.Dispatcher] = st
		c.history[hd.Dispatcher] = append(c.history[hd.Dispatcher], st)
		return
	}
	if st == nil || hd.Epoch < st.epoch {
		if st == nil {
			c.violate("%v: %v before any handshake", hd.Dispatcher, m.Kind())
		} else if m.Kind() != messaging.KindResolved {
			c.stale[hd.Dispatcher]++
		}
		return // a stale epoch's leftovers are ignored, as a collector would
	}
	if hd.Epoch > st.epoch {
		c.violate("%v: %v of epoch %d before its handshake", hd.Dispatcher, m.Kind(), hd.Epoch)
		return
	}
	switch msg := m.(type) {
	case *messaging.Resolved:
		switch {
		case hd.Seq < st.seq:
			return // stale: rows with a later seq were sent meanwhile
		case hd.Seq > st.seq:
			c.violate("%v: resolved seq %d ahead of %d", hd.Dispatcher, hd.Seq, st.seq)
		case msg.Ts < st.resolved:
			c.violate("%v: resolved regressed %v < %v", hd.Dispatcher, msg.Ts, st.resolved)
		case st.partial && msg.Ts >= st.lastCommit:
			// Inside a split transaction only a resolved-ts below its
			// commit-ts is true.
			c.violate("%v: resolved %v inside a split transaction at %v", hd.Dispatcher, msg.Ts, st.lastCommit)
		default:
			st.resolved = msg.Ts
		}
	case *messaging.DMLBatch:
		if hd.Seq != st.seq+1 {
			c.violate("%v: dml seq %d after %d", hd.Dispatcher, hd.Seq, st.seq)
		}
		st.seq = hd.Seq
		for _, r := range msg.Rows {
			if r.CommitTs <= st.resolved || r.CommitTs < st.lastCommit || r.CommitTs <= st.lastDDL {
				c.violate("%v: row %q at %v after resolved %v / row %v / ddl %v", hd.Dispatcher, r.Key, r.CommitTs, st.resolved, st.lastCommit, st.lastDDL)
			}
			st.lastCommit = r.CommitTs
			st.rows = append(st.rows, r)
		}
		st.partial = msg.Partial
		if msg.Partial {
			st.partials++
		}
	case *messaging.DDL:
		if hd.Seq != st.seq+1 {
			c.violate("%v: ddl seq %d after %d", hd.Dispatcher, hd.Seq, st.seq)
		}
		st.seq = hd.Seq
		if msg.CommitTs <= st.resolved || msg.CommitTs < st.lastCommit || msg.CommitTs <= st.lastDDL {
			c.violate("%v: ddl at %v out of order (resolved %v, row %v)", hd.Dispatcher, msg.CommitTs, st.resolved, st.lastCommit)
		}
		st.lastDDL = msg.CommitTs
		st.ddls = append(st.ddls, msg)
	}
}

// waitFor drains until cond holds, failing after a generous deadline (a
// hang is the failure mode being tested; no timing is asserted).
func (c *streamCheckerForTest) waitFor(what string, cond func() bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		c.drain()
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.inbox.Ready():
		case <-ctx.Done():
			c.mu.Lock()
			defer c.mu.Unlock()
			c.t.Fatalf("timed out waiting for %s; violations: %v", what, c.violations)
		}
	}
}

// waitResolved waits until dispatcher id's current epoch reached ts.
func (c *streamCheckerForTest) waitResolved(id common.DispatcherID, ts common.Ts) *epochStream {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%v resolved %v", id, ts), func() bool {
		st := c.streams[id]
		return st != nil && st.resolved >= ts
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

// waitEpochResolved waits until dispatcher id's epoch reached ts (an older
// epoch that already passed ts does not count).
func (c *streamCheckerForTest) waitEpochResolved(id common.DispatcherID, epoch uint64, ts common.Ts) *epochStream {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%v epoch %d resolved %v", id, epoch, ts), func() bool {
		st := c.streams[id]
		return st != nil && st.epoch == epoch && st.resolved >= ts
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

func (c *streamCheckerForTest) stream(id common.DispatcherID) *epochStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

func (c *streamCheckerForTest) assertClean() {
	c.t.Helper()
	c.drain()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Empty(c.t, c.violations)
}

func keys(rows []common.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = string(r.Key)
	}
	return out
}

func (h *harness) dispatcher(id common.DispatcherID) *dispatcher {
	h.svc.mu.RLock()
	defer h.svc.mu.RUnlock()
	return dispatcherForTest(h.svc, id)
}

func (h *harness) targetFor(t *testing.T) *target {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	tg, err := h.svc.targetLocked(testTarget)
	require.NoError(t, err)
	return tg
}

// dispatcherForTest returns the dispatcher registered as id, or nil.
// REQUIRES: svc.mu held, or nothing registering or removing meanwhile.
func dispatcherForTest(svc *Service, id common.DispatcherID) *dispatcher {
	d, _ := svc.mu.dispatchers.Lookup(id)
	return d
}
