package messaging

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/pkg/common"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testDispatcher = common.DispatcherIDFromUint64(1)

func hdr(seq uint64) Header {
	return Header{Dispatcher: testDispatcher, Registration: 5, Epoch: 1, Seq: seq}
}

func row(commit common.Ts, key string) common.Row {
	return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte("v"), StartTs: commit - 1, CommitTs: commit}
}

func TestKindString(t *testing.T) {
	require.Equal(t, "handshake", (&Handshake{}).Kind().String())
	require.Equal(t, "dml", (&DMLBatch{}).Kind().String())
	require.Equal(t, "ddl", (&DDL{}).Kind().String())
	require.Equal(t, "resolved", (&Resolved{}).Kind().String())
	require.Equal(t, "kind(0)", Kind(0).String())
	require.Equal(t, "kind(9)", Kind(9).String())
}

func TestHeaderIsPromoted(t *testing.T) {
	var m Message = &Resolved{Header: hdr(7), Ts: 100}
	require.Equal(t, hdr(7), m.MessageHeader())
	r := m.(*Resolved)
	require.Equal(t, uint64(7), r.Seq)
	require.Equal(t, testDispatcher, r.Dispatcher)
}

func TestSize(t *testing.T) {
	require.Equal(t, 52, (&Handshake{}).Size())
	require.Equal(t, 52, (&Resolved{}).Size())
	require.Equal(t, 2+3*52, (&ResolvedBatch{Entries: make([]Resolved, 3)}).Size())
	require.Equal(t, 40+16+5, (&DDL{Query: "hello"}).Size())
	require.Equal(t, 41, (&DMLBatch{}).Size())
	b := &DMLBatch{Rows: []common.Row{row(5, "ab"), row(6, "c")}}
	// Each row: 17 bytes of fixed fields plus key and value.
	require.Equal(t, 41+(17+3)+(17+2), b.Size())
}

func TestDMLBatchCommitTsHelpers(t *testing.T) {
	var empty DMLBatch
	first, last := empty.CommitTsRange()
	require.Zero(t, first)
	require.Zero(t, last)
	require.Zero(t, empty.CompleteThrough())

	b := &DMLBatch{Rows: []common.Row{row(5, "a"), row(7, "b"), row(7, "c"), row(9, "d"), row(9, "e")}}
	first, last = b.CommitTsRange()
	require.Equal(t, common.Ts(5), first)
	require.Equal(t, common.Ts(9), last)
	require.Equal(t, common.Ts(9), b.CompleteThrough(), "ends at a transaction boundary")

	// The transaction at 9 continues in the next batch: only 7 is complete.
	b.Partial = true
	require.Equal(t, common.Ts(7), b.CompleteThrough())
	// A fragment of one large transaction completes nothing.
	frag := &DMLBatch{Rows: []common.Row{row(9, "a"), row(9, "b")}, Partial: true}
	require.Zero(t, frag.CompleteThrough())
}

func TestValidate(t *testing.T) {
	good := []Message{
		&Handshake{Header: hdr(1), StartTs: 10},
		&DMLBatch{Header: hdr(2), Rows: []common.Row{row(11, "a"), row(11, "b"), row(12, "c")}},
		&DDL{Header: hdr(3), TableID: 0, CommitTs: 12, Query: "alter"},
		&Resolved{Header: hdr(3), Ts: 12},
		&Resolved{Header: hdr(1), Ts: 10},
	}
	for _, m := range good {
		require.NoError(t, Validate(m), "%T", m)
	}

	var nilBatch *DMLBatch
	for name, m := range map[string]Message{
		"nil":                   nil,
		"typed nil":             nilBatch,
		"zero dispatcher":       &Resolved{Header: Header{Registration: 5, Epoch: 1, Seq: 1}},
		"zero registration":     &Resolved{Header: Header{Dispatcher: testDispatcher, Epoch: 1, Seq: 1}},
		"zero epoch":            &Resolved{Header: Header{Dispatcher: testDispatcher, Registration: 5, Seq: 1}},
		"handshake seq 2":       &Handshake{Header: hdr(2)},
		"resolved seq 0":        &Resolved{Header: hdr(0), Ts: 1},
		"dml at seq 1":          &DMLBatch{Header: hdr(1), Rows: []common.Row{row(11, "a")}},
		"dml without rows":      &DMLBatch{Header: hdr(2)},
		"dml rows out of order": &DMLBatch{Header: hdr(2), Rows: []common.Row{row(12, "a"), row(11, "b")}},
		"dml zero commit-ts":    &DMLBatch{Header: hdr(2), Rows: []common.Row{{Op: common.OpPut, Key: []byte("a")}}},
		"dml bad op":            &DMLBatch{Header: hdr(2), Rows: []common.Row{{Op: 9, Key: []byte("a"), CommitTs: 3}}},
		"ddl at seq 1":          &DDL{Header: hdr(1), CommitTs: 5},
		"ddl negative table":    &DDL{Header: hdr(2), TableID: -1, CommitTs: 5},
		"ddl zero commit-ts":    &DDL{Header: hdr(2), TableID: 1},
	} {
		require.ErrorIs(t, Validate(m), ErrInvalidMessage, name)
	}
}

// countingReleaserForTest counts its releases (the owner is the edge this
// test is about).
type countingReleaserForTest struct{ n int }

func (r *countingReleaserForTest) Release() { r.n++ }

// TestResolvedBatchReleaseTellsItsOwnerOnce: Release releases the owner
// once however often it is called, and drops the entries so that a late
// reader finds none rather than the owner's next use of them; a batch
// without an owner keeps its entries.
func TestResolvedBatchReleaseTellsItsOwnerOnce(t *testing.T) {
	owner := &countingReleaserForTest{}
	entries := []Resolved{{Ts: 5}, {Ts: 6}}
	b := NewOwnedResolvedBatch(entries, owner)
	require.Equal(t, entries, b.Entries)
	require.Equal(t, 2, Weight(b))
	b.Release()
	require.Equal(t, 1, owner.n)
	require.Empty(t, b.Entries, "a released batch shows no entries")
	b.Release()
	require.Equal(t, 1, owner.n, "released once")

	plain := &ResolvedBatch{Entries: entries}
	plain.Release()
	require.Equal(t, entries, plain.Entries, "no owner: nothing to release, the entries stay")
	(*ResolvedBatch)(nil).Release() // a typed nil, as a lying transport may hand over: no panic
}
