package pgsource

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Messages as pgoutput writes them (protocol version 1).
func sampleMessages() [][]byte {
	be32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	be64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	tuple := cat([]byte{0, 3}, []byte{'t'}, be32(2), []byte("42"), []byte{'n'}, []byte{'u'})
	return [][]byte{
		cat([]byte{'B'}, be64(0x1000), be64(1_000_000), be32(7)),
		cat([]byte{'C', 0}, be64(0x1000), be64(0x1010), be64(1_000_000)),
		cat([]byte{'R'}, be32(16384), []byte("public\x00t\x00"), []byte{'d'}, []byte{0, 2},
			[]byte{1}, []byte("id\x00"), be32(23), be32(0xffffffff), []byte{0}, []byte("v\x00"), be32(25), be32(0xffffffff)),
		cat([]byte{'I'}, be32(16384), []byte{'N'}, tuple),
		cat([]byte{'U'}, be32(16384), []byte{'K'}, []byte{0, 1, 't'}, be32(1), []byte("1"), []byte{'N'}, tuple),
		cat([]byte{'D'}, be32(16384), []byte{'K'}, []byte{0, 1, 't'}, be32(1), []byte("1")),
		cat([]byte{'T'}, be32(2), []byte{3}, be32(16384), be32(16385)),
		cat([]byte{'M', 1}, be64(0x2000), []byte("cdcflow-heartbeat\x00"), be32(2), []byte("hi")),
	}
}

func TestParseMessages(t *testing.T) {
	msgs := sampleMessages()
	want := []any{
		msgBegin{finalLSN: 0x1000, commitTime: pgEpoch.Add(1_000_000_000), xid: 7},
		msgCommit{commitLSN: 0x1000, endLSN: 0x1010, commitTime: pgEpoch.Add(1_000_000_000)},
		msgRelation{oid: 16384, namespace: "public", name: "t", replicaIdentity: 'd',
			columns: []relColumn{{key: true, name: "id", typeOID: 23, typeMod: -1}, {name: "v", typeOID: 25, typeMod: -1}}},
		msgInsert{rel: 16384, new: []tupleCol{{kind: 't', data: []byte("42")}, {kind: 'n'}, {kind: 'u'}}},
		msgUpdate{rel: 16384, oldKind: 'K', old: []tupleCol{{kind: 't', data: []byte("1")}},
			new: []tupleCol{{kind: 't', data: []byte("42")}, {kind: 'n'}, {kind: 'u'}}},
		msgDelete{rel: 16384, oldKind: 'K', old: []tupleCol{{kind: 't', data: []byte("1")}}},
		msgTruncate{cascade: true, restartIdentity: true, rels: []uint32{16384, 16385}},
		msgMessage{transactional: true, lsn: 0x2000, prefix: "cdcflow-heartbeat", content: []byte("hi")},
	}
	for i, b := range msgs {
		got, err := parseMessage(b)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, want[i], got, "message %d", i)
		// Every strict prefix is malformed, never a panic.
		for n := range len(b) {
			_, err := parseMessage(b[:n])
			require.ErrorIs(t, err, ErrMalformedMessage, "message %d, prefix of %d bytes", i, n)
		}
	}
}

// A column length or a count the message does not hold is refused before
// anything is allocated for it.
func TestParseRefusesLengthsPastTheEnd(t *testing.T) {
	huge := append([]byte{'I', 0, 0, 0x40, 0, 'N', 0, 1, 't'}, 0xff, 0xff, 0xff, 0xff)
	_, err := parseMessage(huge)
	require.ErrorIs(t, err, ErrMalformedMessage)
	_, err = parseMessage([]byte{'I', 0, 0, 0x40, 0, 'N', 0xff, 0xff})
	require.ErrorIs(t, err, ErrMalformedMessage, "65535 columns in no bytes")
	_, err = parseMessage([]byte{'T', 0xff, 0xff, 0xff, 0xff, 0})
	require.ErrorIs(t, err, ErrMalformedMessage)
}

func FuzzParseMessage(f *testing.F) {
	for _, b := range sampleMessages() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := parseMessage(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedMessage)
		}
	})
}

// A commit time before the Unix epoch or past what a commit-ts can hold
// would wrap the Ts it becomes (a commit-ts far behind or ahead of every
// other): the message is malformed. The bounds themselves parse.
func TestACommitTimeOutOfRangeIsMalformed(t *testing.T) {
	begin := func(us int64) []byte {
		b := []byte{'B'}
		b = binary.BigEndian.AppendUint64(b, 0x1000)
		b = binary.BigEndian.AppendUint64(b, uint64(us))
		return binary.BigEndian.AppendUint32(b, 7)
	}
	for _, us := range []int64{minCommitMicros - 1, maxCommitMicros + 1, math.MinInt64, math.MaxInt64} {
		_, err := parseMessage(begin(us))
		require.ErrorIs(t, err, ErrMalformedMessage, "%d", us)
	}
	for _, us := range []int64{minCommitMicros, 0, 1_000_000_000, maxCommitMicros} {
		m, err := parseMessage(begin(us))
		require.NoError(t, err, "%d", us)
		ts := common.TsFromTime(m.(msgBegin).commitTime)
		require.Equal(t, us/1000-minCommitMicros/1000, ts.PhysicalMs(), "%d: the Ts keeps the time", us)
	}
}
