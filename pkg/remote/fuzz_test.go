package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Every decoder of what crosses the wire has a fuzz target; `make fuzz`
// runs each, and `go test` runs their seeds (here and in
// testdata/fuzz/<name>/). A decoder may refuse (a typed error) but never
// panic, and what it accepts re-encodes to what decodes the same.

// dmlFrameClaimingRows is a data frame of one DMLBatch whose row count is
// rows, followed by tail: the shape of the frame that crashed collectors
// (a count past the frame's end still allocated).
func dmlFrameClaimingRows(rows uint64, tail []byte) []byte {
	e := encoder{}
	e.u(1)
	e.byte(byte(messaging.KindDMLBatch))
	e.id(disp)
	e.u(7)
	e.u(1)
	e.u(2)
	e.byte(0)
	e.u(rows)
	return append(e.b, tail...)
}

// The frames of the crash: a row count past the frame's end (2^40 rows:
// makeslice panicked), and one the frame's size allows but its bytes do
// not (each row needs at least minRowBytes).
func TestDecodeRefusesRowCountsTheFrameCannotHold(t *testing.T) {
	for name, b := range map[string][]byte{
		"count past the end":                  dmlFrameClaimingRows(1<<40, nil),
		"count of 2^64-1":                     dmlFrameClaimingRows(^uint64(0), nil),
		"a byte per claimed row":              dmlFrameClaimingRows(1000, make([]byte, 1000)),
		"messages past the end":               binary.AppendUvarint(nil, 1<<40),
		"a byte per message":                  append(binary.AppendUvarint(nil, 100), make([]byte, 100)...),
		"control: checkpoints":                append(append([]byte(wireMagic), WireVersion, opHeartbeat), binary.AppendUvarint(nil, 5000)...),
		"control: 2^64 checkpoints":           append(append([]byte(wireMagic), WireVersion, opHeartbeat), binary.AppendUvarint(nil, ^uint64(0))...),
		"control: registrations past the end": append(append([]byte(wireMagic), WireVersion, opRegisterBatch), binary.AppendUvarint(nil, 1<<40)...),
		"control: no registrations":           append(append([]byte(wireMagic), WireVersion, opRegisterBatch), 0),
		"control: too many registrations": append(append(append([]byte(wireMagic), WireVersion, opRegisterBatch),
			binary.AppendUvarint(nil, messaging.MaxRegisterBatch+1)...), make([]byte, (messaging.MaxRegisterBatch+1)*minRegisterBytes)...),
		"batch: entries past the end": resolvedBatchFrame(1<<40, nil),
		"batch: a byte per entry":     resolvedBatchFrame(100, make([]byte, 100)),
		"batch: no entries":           resolvedBatchFrame(0, make([]byte, 32)),
		"batch: too many entries":     resolvedBatchFrame(messaging.MaxResolvedBatchEntries+1, make([]byte, (messaging.MaxResolvedBatchEntries+1)*minBatchEntryBytes)),
		"batch: a slot beyond 32 bits": func() []byte {
			entry := make([]byte, 16+4) // dispatcher, registration, epoch, seq, ts
			return resolvedBatchFrame(1, binary.AppendUvarint(entry, 1<<32))
		}(),
	} {
		require.NotPanics(t, func() {
			if name[:8] == "control:" {
				_, err := decodeControl(b)
				require.ErrorIs(t, err, ErrMalformed, name)
				return
			}
			_, err := decodeMessages(b)
			require.ErrorIs(t, err, ErrMalformed, name)
		}, name)
	}
	_, err := decodeReply(append([]byte{0}, binary.AppendUvarint(nil, 1<<40)...))
	require.ErrorIs(t, err, messaging.ErrInternal, "a reply claiming more codes than it holds")
	_, err = decodeReply(append([]byte{byte(messaging.CodeInternal), 0}, binary.AppendUvarint(nil, 1<<40)...))
	require.ErrorIs(t, err, ErrMalformed, "a reply claiming a message longer than it holds")
}

// What decoding a frame allocates is bounded by a small multiple of the
// frame, whatever its counts claim: a 1 MiB frame whose row count its size
// allows but its bytes do not once cost about 100 MiB.
func TestDecodeAllocationIsBoundedByTheFrame(t *testing.T) {
	const size = 1 << 20
	frames := map[string][]byte{
		// A row claimed per byte: refused before anything is allocated
		// (allowing a count up to the bytes left cost ~100x the frame).
		"a row per byte": dmlFrameClaimingRows(size, make([]byte, size)),
		// The most rows the bytes allow, then garbage: decoding fails
		// after allocating the rows.
		"lying count": dmlFrameClaimingRows(size/minRowBytes, make([]byte, size)),
		// As many minimal resolved-ts batches as fit.
		"minimal batches": func() []byte {
			var b []byte
			n := 0
			for len(b)+2+messaging.MaxResolvedBatchEntries*minBatchEntryBytes <= size {
				b = append(b, byte(messaging.KindResolvedBatch))
				b = binary.AppendUvarint(b, messaging.MaxResolvedBatchEntries)
				b = append(b, make([]byte, messaging.MaxResolvedBatchEntries*minBatchEntryBytes)...)
				n++
			}
			return append(binary.AppendUvarint(nil, uint64(n)), b...)
		}(),
		// As many minimal valid rows as fit: the worst valid frame.
		"minimal rows": func() []byte {
			var rows []byte
			for len(rows)+minRowBytes <= size {
				rows = append(rows, byte(common.OpPut), 0, 0, 0, 1, 1)
			}
			return dmlFrameClaimingRows(uint64(len(rows)/minRowBytes), rows)
		}(),
	}
	for name, b := range frames {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, _ = decodeMessages(b)
		runtime.ReadMemStats(&after)
		allocated := after.TotalAlloc - before.TotalAlloc
		require.LessOrEqual(t, allocated, uint64(maxDecodeAmplification*len(b)), "%s: %d bytes for a %d-byte frame", name, allocated, len(b))
		t.Logf("%s: %d-byte frame, %d bytes allocated (%.1fx)", name, len(b), allocated, float64(allocated)/float64(len(b)))
	}
}

func FuzzDecodeControl(f *testing.F) {
	reg := messaging.RegisterRequest{Dispatcher: disp, Registration: 7, Span: common.Span{TableID: 3, StartKey: []byte("a"), EndKey: []byte("b")},
		StartTs: 9, Target: "c1", Replace: true, Slot: 11}
	f.Add(appendRegister(nil, reg))
	f.Add(appendReset(nil, messaging.ResetRequest{Dispatcher: disp, Registration: 7, Epoch: 2, StartTs: 5}))
	f.Add(appendRemove(nil, messaging.RemoveRequest{Dispatcher: disp, Registration: 7}))
	f.Add(appendHeartbeat(nil, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{{Dispatcher: disp, Registration: 7, Epoch: 1, Ts: 4, Slot: 12}}}))
	reg2 := reg
	reg2.Dispatcher, reg2.Replace = common.DispatcherID{Lo: 5}, false
	f.Add(appendRegisterBatch(nil, []messaging.RegisterRequest{reg, reg2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeControl(b)
		if err != nil {
			require.True(t, errorsIsAny(err, ErrMalformed, ErrVersionMismatch), "%v", err)
			return
		}
		var again []byte
		switch r.op {
		case opRegister:
			again = appendRegister(nil, r.register)
		case opReset:
			again = appendReset(nil, r.reset)
		case opRemove:
			again = appendRemove(nil, r.remove)
		case opHeartbeat:
			again = appendHeartbeat(nil, r.heartbeat)
		case opRegisterBatch:
			again = appendRegisterBatch(nil, r.batch.Requests)
		}
		r2, err := decodeControl(again)
		require.NoError(t, err)
		require.Equal(t, r, r2)
	})
}

func FuzzDecodeReply(f *testing.F) {
	f.Add(appendReply(nil, messaging.CodeOK, nil, ""))
	f.Add(appendReply(nil, messaging.CodeOK, []messaging.Code{messaging.CodeOK, messaging.CodeStaleEpoch, messaging.CodePermissionDenied}, ""))
	f.Add(appendReply(nil, messaging.CodeLimitExceeded, nil, "messaging: limit exceeded: 1024 targets already"))
	f.Fuzz(func(t *testing.T, b []byte) {
		codes, err := decodeReply(b)
		if errors.Is(err, ErrMalformed) {
			require.ErrorIs(t, err, messaging.ErrInternal, "an undecodable reply is an internal error")
			return
		}
		// A reply that decodes re-encodes to one that decodes the same.
		msg := ""
		if _, said, ok := strings.Cut(fmt.Sprint(err), "the service said: "); ok {
			msg, _ = strconv.Unquote(said)
		}
		again, err2 := decodeReply(appendReply(nil, messaging.Code(b[0]), codes, msg))
		require.Equal(t, codes, again)
		require.Equal(t, messaging.CodeOf(err), messaging.CodeOf(err2))
		if err != nil {
			require.Equal(t, err.Error(), err2.Error())
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add(appendHello(nil, "changefeed-1", 4096, 4096))
	f.Add(appendHello(nil, "\xff\xfe", 1, 1))
	f.Add(appendHello(nil, "c", ^uint32(0), ^uint32(0)))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b)
		if err != nil {
			require.True(t, errorsIsAny(err, ErrMalformed, ErrVersionMismatch), "%v", err)
			return
		}
		require.NoError(t, h.target.Validate(), "an accepted hello names a valid target")
		require.NotZero(t, h.capacity)
		require.LessOrEqual(t, h.credit, h.capacity)
		h2, err := decodeHello(appendHello(nil, h.target, h.capacity, h.credit))
		require.NoError(t, err)
		require.Equal(t, h, h2)
	})
}

func FuzzDecodeCredit(f *testing.F) {
	f.Add(appendCredit(nil, 0, mark{}))
	f.Add(appendCredit(nil, 17, mark{weight: 5, tag: 9}))
	f.Add(appendCredit(nil, ^uint32(0), mark{weight: ^uint64(0), tag: ^uint64(0)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, m, err := decodeCredit(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		again, m2, err := decodeCredit(appendCredit(nil, n, m))
		require.NoError(t, err)
		require.Equal(t, n, again)
		require.Equal(t, m, m2)
	})
}

func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// A Send is cut into frames of about frameTargetBytes between messages,
// in order; each decodes on its own, and together they are the batch.
func TestSendIsCutIntoFramesBetweenMessages(t *testing.T) {
	var msgs []messaging.Message
	for i := range 40 {
		msgs = append(msgs, &messaging.DMLBatch{Header: hdr(uint64(i + 2)), Rows: []common.Row{{Op: common.OpPut, Key: []byte("k"),
			Value: make([]byte, 20<<10), StartTs: 1, CommitTs: 2}}})
	}
	msgs = append(msgs, &messaging.Resolved{Header: hdr(41), Ts: 3})
	key := newMarkKey()
	frames, sent := appendFrames(nil, msgs, key, 7)
	require.Greater(t, len(frames), 2)
	require.Equal(t, uint64(7+len(msgs)), sent)
	var got []messaging.Message
	weight := uint64(7)
	for _, f := range frames {
		require.LessOrEqual(t, len(f), frameTargetBytes+(21<<10), "cut at the first message past the target")
		m, part, err := decodeDataFrame(f)
		require.NoError(t, err)
		weight += uint64(messaging.WeightOf(part))
		require.Equal(t, key.mark(weight), m, "each frame is marked with the weight through it")
		got = append(got, part...)
	}
	require.Equal(t, msgs, got)
	one, _ := appendFrames(nil, msgs[:1], key, 0)
	require.Len(t, one, 1)
	var head encoder
	head.mark(key.mark(1))
	require.Equal(t, appendMessages(head.b, msgs[:1]), one[0], "a small batch is the one frame appendMessages makes, marked")
}

// resolvedBatchFrame is a data frame of one ResolvedBatch claiming n
// entries, followed by body.
func resolvedBatchFrame(n uint64, body []byte) []byte {
	b := append(binary.AppendUvarint(nil, 1), byte(messaging.KindResolvedBatch))
	return append(binary.AppendUvarint(b, n), body...)
}
