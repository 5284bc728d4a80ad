package common

import "fmt"

// OpType is the kind of a row change.
type OpType uint8

const (
	// OpPut inserts or updates a row.
	OpPut OpType = 1
	// OpDelete deletes a row.
	OpDelete OpType = 2
)

// Valid reports whether op is a known operation.
func (op OpType) Valid() bool { return op == OpPut || op == OpDelete }

// String returns "put", "delete" or "op(N)".
func (op OpType) String() string {
	switch op {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	default:
		return fmt.Sprintf("op(%d)", uint8(op))
	}
}

// Row is one row change of a transaction. Rows of one transaction share
// StartTs and CommitTs; several transactions may share a CommitTs.
type Row struct {
	Op       OpType
	Key      []byte
	Value    []byte
	OldValue []byte
	StartTs  Ts
	CommitTs Ts
}

// Size is the number of payload bytes the row carries (keys and values).
func (r *Row) Size() int { return len(r.Key) + len(r.Value) + len(r.OldValue) }

// Clone returns a deep copy of r whose byte slices share nothing with r.
func (r Row) Clone() Row {
	r.Key = cloneBytes(r.Key)
	r.Value = cloneBytes(r.Value)
	r.OldValue = cloneBytes(r.OldValue)
	return r
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
