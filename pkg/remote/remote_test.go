package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/internal/promutil"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var disp = common.DispatcherID{Hi: 1, Lo: 2}

func hdr(seq uint64) messaging.Header {
	return messaging.Header{Dispatcher: disp, Registration: 7, Epoch: 1, Seq: seq}
}

// every message type, with the byte-slice cases that must survive: nil
// and empty are different for a row's OldValue.
func sampleMessages() []messaging.Message {
	return []messaging.Message{
		&messaging.Handshake{Header: hdr(1), StartTs: 100, Slot: 3},
		&messaging.DMLBatch{Header: hdr(2), Partial: true, Rows: []common.Row{
			{Op: common.OpPut, Key: []byte("k1"), Value: []byte("v1"), OldValue: nil, StartTs: 101, CommitTs: 102},
			{Op: common.OpDelete, Key: []byte("k2"), Value: []byte{}, OldValue: []byte("old"), StartTs: 103, CommitTs: 104},
		}},
		&messaging.DDL{Header: hdr(3), TableID: 5, CommitTs: 105, Query: "ALTER TABLE t ADD c int"},
		&messaging.Resolved{Header: hdr(3), Ts: 106, Slot: 7},
		&messaging.ResolvedBatch{Entries: []messaging.Resolved{
			{Header: hdr(3), Ts: 107, Slot: 1},
			{Header: messaging.Header{Dispatcher: common.DispatcherID{Hi: 9, Lo: 9}, Registration: 8, Epoch: 2, Seq: 5}, Ts: 108, Slot: 1<<32 - 1},
		}},
	}
}

func TestWireRoundTrip(t *testing.T) {
	msgs := sampleMessages()
	got, err := decodeMessages(appendMessages(nil, msgs))
	require.NoError(t, err)
	require.Equal(t, msgs, got)
	// Every strict prefix of a frame is malformed, never a panic or a
	// different frame.
	b := appendMessages(nil, msgs)
	for n := range len(b) {
		_, err := decodeMessages(b[:n])
		require.ErrorIs(t, err, ErrMalformed, "prefix of %d bytes", n)
	}
}

// TestDecodedBytesOwnTheirMemory: a received data frame's byte fields are
// the frame's own bytes, which nothing writes again: rawCodec copies what
// gRPC hands it (gRPC reuses that) into a fresh buffer for every frame,
// even one received into the same frame value, and overwriting gRPC's
// buffer afterwards changes no decoded row. The fields are capped, so an
// append to a row's key cannot reach its value.
func TestDecodedBytesOwnTheirMemory(t *testing.T) {
	msgs := sampleMessages()
	grpcBuf := appendMessages(nil, msgs)
	var f frame
	require.NoError(t, rawCodec{}.Unmarshal(grpcBuf, &f))
	got, err := decodeMessages(f.b)
	require.NoError(t, err)
	for i := range grpcBuf {
		grpcBuf[i] = 0xAA // gRPC reuses its buffer
	}
	require.Equal(t, msgs, got, "gRPC's buffer overwritten after decoding")
	require.NoError(t, rawCodec{}.Unmarshal(grpcBuf, &f)) // the next frame, into the same value
	require.Equal(t, msgs, got, "the next frame received into the same frame value")
	rows := got[1].(*messaging.DMLBatch).Rows
	for i := range rows {
		for _, b := range [][]byte{rows[i].Key, rows[i].Value, rows[i].OldValue} {
			require.Equal(t, len(b), cap(b), "row %d: a field with room to grow into the next", i)
		}
	}
	_ = append(rows[0].Key, 'X', 'Y', 'Z')
	require.Equal(t, msgs, got, "an append to a decoded key")
}

// resolvedAmongOthers is a frame of resolved-ts between and after other
// kinds: the decoder puts a frame's resolved-ts in one slab.
func resolvedAmongOthers() []messaging.Message {
	return []messaging.Message{
		&messaging.Resolved{Header: hdr(1), Ts: 99},
		&messaging.Handshake{Header: hdr(1), StartTs: 100, Slot: 3},
		&messaging.Resolved{Header: hdr(1), Ts: 100},
		&messaging.DDL{Header: hdr(2), TableID: 5, CommitTs: 105, Query: "ALTER TABLE t ADD c int"},
		&messaging.Resolved{Header: hdr(2), Ts: 106},
		&messaging.Resolved{Header: hdr(2), Ts: 107},
	}
}

// TestWireResolvedSlabKeepsEachMessageItsOwn: decoded resolved-ts come
// out equal, in order, and each its own (changing one changes no other):
// the slab they share never moved under the pointers taken into it.
func TestWireResolvedSlabKeepsEachMessageItsOwn(t *testing.T) {
	msgs := resolvedAmongOthers()
	got, err := decodeMessages(appendMessages(nil, msgs))
	require.NoError(t, err)
	require.Equal(t, msgs, got)
	first := got[0].(*messaging.Resolved)
	first.Ts = 1
	require.Equal(t, msgs[2:], got[2:], "the others are untouched")
}

// requireEncodedSizeExact: encodedSize is the length message writes, for
// each of msgs (appendFrames sizes each frame's one allocation by it).
func requireEncodedSizeExact(t *testing.T, msgs []messaging.Message) {
	t.Helper()
	for i, m := range msgs {
		var e encoder
		e.message(m)
		require.Equal(t, len(e.b), encodedSize(m), "message %d (%v)", i, m.Kind())
	}
}

// TestEncodedSizeIsExact: every kind, at the varints' edges (zero, one
// byte's largest, the largest uint64, a negative table), nil and empty
// slices apart.
func TestEncodedSizeIsExact(t *testing.T) {
	requireEncodedSizeExact(t, sampleMessages())
	requireEncodedSizeExact(t, resolvedAmongOthers())
	for _, v := range []uint64{0, 127, 128, 1<<63 - 1, 1<<64 - 1} {
		h := messaging.Header{Dispatcher: common.DispatcherID{Hi: v, Lo: v}, Registration: messaging.RegistrationID(v), Epoch: v, Seq: v}
		requireEncodedSizeExact(t, []messaging.Message{
			&messaging.Handshake{Header: h, StartTs: common.Ts(v), Slot: uint32(v)},
			&messaging.DMLBatch{Header: h, Rows: []common.Row{{Op: common.OpPut, Key: make([]byte, v%300), Value: nil,
				OldValue: []byte{}, StartTs: common.Ts(v), CommitTs: common.Ts(v)}}},
			&messaging.DDL{Header: h, TableID: int64(v), CommitTs: common.Ts(v), Query: string(make([]byte, v%200))},
			&messaging.DDL{Header: h, TableID: -int64(v % (1 << 62)), Query: ""},
			&messaging.Resolved{Header: h, Ts: common.Ts(v), Slot: uint32(v)},
			&messaging.ResolvedBatch{Entries: []messaging.Resolved{{Header: h, Ts: common.Ts(v), Slot: uint32(v)}}},
			&messaging.ResolvedBatch{},
		})
	}
}

func FuzzDecodeMessages(f *testing.F) {
	f.Add(appendMessages(nil, sampleMessages()))
	f.Add(appendMessages(nil, resolvedAmongOthers()))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(resolvedBatchFrame(3, make([]byte, 3*minBatchEntryBytes)))
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := decodeMessages(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		requireEncodedSizeExact(t, msgs)
		// What decodes re-encodes to a frame that decodes to the same.
		again, err := decodeMessages(appendMessages(nil, msgs))
		require.NoError(t, err)
		require.Equal(t, msgs, again)
	})
}

// controlForTest is the service's control plane as this package's tests
// need it: it records calls and answers with a chosen error (a mock at the
// edge under test, the wire).
type controlForTest struct {
	calls chan any
	err   error
	codes []messaging.Code
}

func (c *controlForTest) Register(_ context.Context, r messaging.RegisterRequest) error {
	c.calls <- r
	return c.err
}
func (c *controlForTest) Reset(_ context.Context, r messaging.ResetRequest) error {
	c.calls <- r
	return c.err
}
func (c *controlForTest) Remove(_ context.Context, r messaging.RemoveRequest) error {
	c.calls <- r
	return c.err
}

// RegisterBatch records the whole batch as one call and answers every
// entry CodeOK, or with codes when the test set as many.
func (c *controlForTest) RegisterBatch(_ context.Context, r messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	c.calls <- r
	reply := messaging.RegisterBatchReply{Codes: make([]messaging.Code, len(r.Requests))}
	if len(c.codes) == len(r.Requests) {
		copy(reply.Codes, c.codes)
	}
	return reply, c.err
}

func (c *controlForTest) Heartbeat(_ context.Context, r messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	c.calls <- r
	return messaging.HeartbeatReply{Codes: c.codes}, c.err
}

type pair struct {
	srv *Server
	cli *Client
	cp  *controlForTest
}

// start runs a server on a loopback port and a client for target "c1"
// with the given inbox capacity, and waits until the client's stream is
// registered with the server.
func start(t *testing.T, capacity int) *pair {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cp := &controlForTest{calls: make(chan any, 16)}
	srv, err := NewServer(ServerOptions{})
	require.NoError(t, err)
	require.NoError(t, srv.Start(lis, cp))
	cli, err := NewClient(ClientOptions{Addr: lis.Addr().String(), Target: "c1", Capacity: capacity})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	t.Cleanup(func() { cli.Close(); srv.Close() })
	waitConnected(t, srv, "c1")
	return &pair{srv: srv, cli: cli, cp: cp}
}

// waitConnected waits for target's stream to reach the server: Send of
// nothing only checks the target.
func waitConnected(t *testing.T, srv *Server, target messaging.Target) {
	t.Helper()
	testwait.For(t, string(target)+" connected", func() bool { return srv.Send(target, nil) == nil })
}

func receive(t *testing.T, in *messaging.Inbox, n int) []messaging.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []messaging.Message
	for len(got) < n {
		var err error
		got, err = in.Receive(ctx, got, n-len(got))
		require.NoError(t, err)
	}
	return got
}

func TestSendArrivesInOrder(t *testing.T) {
	p := start(t, 64)
	msgs := sampleMessages()
	require.NoError(t, p.srv.Send("c1", msgs[:2]))
	require.NoError(t, p.srv.Send("c1", msgs[2:]))
	require.Equal(t, msgs, receive(t, p.cli.Inbox(), len(msgs)))
	require.ErrorIs(t, p.srv.Send("nobody", msgs), messaging.ErrUnknownTarget)
	require.ErrorIs(t, p.srv.Send("c1", []messaging.Message{nil}), messaging.ErrInvalidMessage)
}

// With the collector not draining, the service may send its inbox's
// capacity and no more: then ErrBusy, and Room's channel stays open until
// the collector drains to half and grants the credit back; after that the
// sends go through. Send never waited.
func TestCreditRefusesThenWakes(t *testing.T) {
	const capacity = 8
	p := start(t, capacity)
	one := func(seq uint64) []messaging.Message {
		return []messaging.Message{&messaging.Resolved{Header: hdr(seq), Ts: common.Ts(seq)}}
	}
	for i := range capacity {
		require.NoError(t, p.srv.Send("c1", one(uint64(i+1))))
	}
	require.ErrorIs(t, p.srv.Send("c1", one(99)), messaging.ErrBusy)
	require.ErrorIs(t, p.srv.Send("c1", make([]messaging.Message, capacity+1)), messaging.ErrInvalidMessage)
	room := p.srv.Room("c1")
	require.False(t, p.srv.HasRoom("c1"), "HasRoom answers as Room does")
	got := receive(t, p.cli.Inbox(), capacity) // arrived; the inbox is now drained
	require.Len(t, got, capacity)
	select {
	case <-room:
	case <-time.After(30 * time.Second):
		t.Fatal("no credit came back after the collector drained")
	}
	require.True(t, p.srv.HasRoom("c1"))
	require.True(t, p.srv.HasRoom("nobody"), "a target that never connected: Send says why")
	require.NoError(t, p.srv.Send("c1", one(capacity+1)))
	require.Equal(t, one(capacity+1), receive(t, p.cli.Inbox(), 1))

	// Credit counts a resolved-ts batch by its entries, as the inbox does.
	batch := func(n int) []messaging.Message {
		b := &messaging.ResolvedBatch{Entries: make([]messaging.Resolved, n)}
		for i := range b.Entries {
			b.Entries[i] = messaging.Resolved{Header: hdr(uint64(i + 1)), Ts: 10}
		}
		return []messaging.Message{b}
	}
	require.ErrorIs(t, p.srv.Send("c1", batch(capacity+1)), messaging.ErrBatchTooLarge)
	waitCredit := func(n int) { // the grant for what was received comes back asynchronously
		t.Helper()
		for p.srv.Send("c1", batch(n)) != nil {
			select {
			case <-p.srv.Room("c1"):
			case <-time.After(30 * time.Second):
				t.Fatal("no credit came back")
			}
		}
	}
	waitCredit(capacity - 1)
	require.ErrorIs(t, p.srv.Send("c1", batch(2)), messaging.ErrBusy, "one entry of credit left")
	require.Len(t, receive(t, p.cli.Inbox(), 1), 1)
}

func TestBatchLargerThanTheCollectorIsTooLarge(t *testing.T) {
	p := start(t, 2)
	msgs := sampleMessages()
	require.ErrorIs(t, p.srv.Send("c1", msgs), messaging.ErrBatchTooLarge)
}

// The collector goes away: its stream breaks and Send says so with
// ErrUnavailable (the service backs off); a reconnect restores it.
func TestBrokenStreamIsUnavailableUntilReconnect(t *testing.T) {
	p := start(t, 16)
	p.cli.Close()
	var err error
	testwait.For(t, "the server noticing the collector left", func() bool {
		err = p.srv.Send("c1", sampleMessages()[:1])
		return err != nil
	})
	require.ErrorIs(t, err, messaging.ErrUnavailable)
	require.ErrorIs(t, err, messaging.ErrSendFailed)
	select {
	case <-p.srv.Room("c1"): // gone: a waiting sender is woken to find out
	default:
		t.Fatal("Room of a broken stream must be closed")
	}
	require.True(t, p.srv.HasRoom("c1"), "a broken stream has room: the next Send says why")

	cli, err := NewClient(ClientOptions{Addr: p.cli.opts.Addr, Target: "c1", Capacity: 16})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	waitConnected(t, p.srv, "c1")
	require.NoError(t, p.srv.Send("c1", sampleMessages()[:1]))
	require.Equal(t, sampleMessages()[:1], receive(t, cli.Inbox(), 1))
}

func TestControlCallsCarryTheirCodes(t *testing.T) {
	p := start(t, 4)
	ctx := context.Background()
	reg := messaging.RegisterRequest{Dispatcher: disp, Registration: 7, Span: common.TableSpan(3), StartTs: 5, Target: "c1", Slot: 42}
	require.NoError(t, p.cli.Register(ctx, reg))
	require.Equal(t, reg, <-p.cp.calls)
	reg.Registration, reg.Replace = 8, true // a takeover crosses the wire as one
	require.NoError(t, p.cli.Register(ctx, reg))
	require.Equal(t, reg, <-p.cp.calls)

	for _, sentinel := range []error{messaging.ErrDispatcherExists, messaging.ErrUnknownDispatcher,
		messaging.ErrStaleRegistration, messaging.ErrStaleEpoch, messaging.ErrClosed, messaging.ErrUnavailable} {
		p.cp.err = sentinel
		err := p.cli.Reset(ctx, messaging.ResetRequest{Dispatcher: disp, Registration: 7, Epoch: 2, StartTs: 9})
		require.ErrorIs(t, err, sentinel)
		<-p.cp.calls
	}
	p.cp.err = errors.New("disk on fire")
	require.ErrorIs(t, p.cli.Remove(ctx, messaging.RemoveRequest{Dispatcher: disp, Registration: 7}), messaging.ErrInternal)
	<-p.cp.calls

	p.cp.err = nil
	p.cp.codes = []messaging.Code{messaging.CodeOK, messaging.CodeStaleEpoch}
	hb := messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
		{Dispatcher: disp, Registration: 7, Epoch: 1, Ts: 10}, {Dispatcher: common.DispatcherID{Lo: 9}, Registration: 8, Epoch: 3, Ts: 11}}}
	reply, err := p.cli.Heartbeat(ctx, hb)
	require.NoError(t, err)
	require.Equal(t, p.cp.codes, reply.Codes)
	require.Equal(t, hb, <-p.cp.calls)

	// A batch of registrations is one call, answered entry by entry.
	p.cp.codes = []messaging.Code{messaging.CodeOK, messaging.CodeDispatcherExists}
	batch := messaging.RegisterBatchRequest{Requests: []messaging.RegisterRequest{reg, {Dispatcher: common.DispatcherID{Lo: 9},
		Registration: 9, Span: common.Span{TableID: 4, StartKey: []byte("a"), EndKey: []byte("b")}, StartTs: 6, Target: "c1", Slot: 43}}}
	breply, err := p.cli.RegisterBatch(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, p.cp.codes, breply.Codes)
	require.Equal(t, batch, <-p.cp.calls)

	// Invalid requests are refused before the wire.
	require.ErrorIs(t, p.cli.Register(ctx, messaging.RegisterRequest{}), messaging.ErrInvalidRequest)
	_, err = p.cli.RegisterBatch(ctx, messaging.RegisterBatchRequest{})
	require.ErrorIs(t, err, messaging.ErrInvalidRequest)
}

// TestRegisterBatchBeyondAFrameIsCut: a batch whose encoding exceeds the
// largest frame the service reads (long span keys) goes as several calls,
// every entry in order, every code back.
func TestRegisterBatchBeyondAFrameIsCut(t *testing.T) {
	p := start(t, 4)
	key := func(b byte) []byte { return bytes.Repeat([]byte{b}, common.MaxSpanKeyBytes) }
	var batch messaging.RegisterBatchRequest
	for i := range 40 { // 40 x 32 KiB of keys: about 1.3 MiB
		batch.Requests = append(batch.Requests, messaging.RegisterRequest{Dispatcher: common.DispatcherID{Lo: uint64(i + 1)},
			Registration: 7, Span: common.Span{TableID: 1, StartKey: key('a'), EndKey: key('b')}, Target: "c1"})
	}
	go func() {
		reply, err := p.cli.RegisterBatch(context.Background(), batch)
		if err == nil && len(reply.Codes) != len(batch.Requests) {
			err = fmt.Errorf("%d codes", len(reply.Codes))
		}
		p.cp.calls <- err
	}()
	var got []messaging.RegisterRequest
	calls := 0
	for done := false; !done; {
		switch c := (<-p.cp.calls).(type) {
		case messaging.RegisterBatchRequest:
			calls++
			got = append(got, c.Requests...)
		case error:
			require.NoError(t, c)
			done = true
		default: // the nil error: the call returned
			done = true
		}
	}
	require.Greater(t, calls, 1, "cut into several calls")
	require.Equal(t, batch.Requests, got)
}

// A service that cannot be reached is ErrUnavailable for control calls.
func TestUnreachableServiceIsUnavailable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1"})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = cli.Remove(ctx, messaging.RemoveRequest{Dispatcher: disp, Registration: 7})
	require.ErrorIs(t, err, messaging.ErrUnavailable)
}

// A service that goes away and comes back on the same address: the client
// opens a new stream by itself, says so on Reconnected (once for the
// reconnect, none for the first stream), and delivery resumes; the
// metrics count both streams on each side's registry.
func TestClientReconnectsToARestartedService(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	cp := &controlForTest{calls: make(chan any, 16)}
	srvReg := prometheus.NewRegistry()
	srv, err := NewServer(ServerOptions{Registerer: srvReg})
	require.NoError(t, err)
	require.NoError(t, srv.Start(lis, cp))
	cliReg := prometheus.NewRegistry()
	cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1", Capacity: 16, Registerer: cliReg, RetryBase: time.Millisecond, RetryMax: 10 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	waitConnected(t, srv, "c1")
	select {
	case <-cli.Reconnected():
		t.Fatal("the first stream is not a reconnect")
	default:
	}
	require.Equal(t, 1, srv.Connected())
	requireMetric(t, srvReg, "cdcflow_remote_server_connected_collectors", 1)
	mfs, err := srvReg.Gather()
	require.NoError(t, err)
	refused := 0
	for _, mf := range mfs {
		if mf.GetName() == "cdcflow_remote_server_refused_sends_total" {
			refused = len(mf.GetMetric())
		}
	}
	require.Equal(t, 3+1, refused, "every refusal reason of the target is scraped, at zero, once a collector connected (and the one series of targets never connected)")
	require.NoError(t, srv.Send("c1", sampleMessages()[:2]))
	requireMetric(t, srvReg, "cdcflow_remote_server_in_flight_messages", 2)
	require.Equal(t, sampleMessages()[:2], receive(t, cli.Inbox(), 2))
	srv.Close()

	lis2, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv2, err := NewServer(ServerOptions{})
	require.NoError(t, err)
	require.NoError(t, srv2.Start(lis2, cp))
	defer srv2.Close()
	select {
	case <-cli.Reconnected():
	case <-time.After(30 * time.Second):
		t.Fatal("no reconnect signalled")
	}
	waitConnected(t, srv2, "c1")
	require.NoError(t, srv2.Send("c1", sampleMessages()[2:4]))
	require.Equal(t, sampleMessages()[2:4], receive(t, cli.Inbox(), 2))
	require.Equal(t, int64(2), cli.Streams())
	requireMetric(t, cliReg, "cdcflow_remote_client_streams_total", 2)
	requireMetric(t, cliReg, "cdcflow_remote_client_received_messages_total", 4)
}

// requireMetric checks the value of the single series named name in reg.
func requireMetric(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	got, series, err := promutil.Sum(reg, name)
	require.NoError(t, err)
	require.Equal(t, 1, series, "series of %s", name)
	require.Equal(t, want, got, name)
}
