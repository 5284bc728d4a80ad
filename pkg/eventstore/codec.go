package eventstore

import (
	"encoding/binary"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Key layout (all integers big-endian, so byte order is numeric order):
//
//	subID(8) | commitTs(8) | startTs(8) | rowKey
//
// A subscription's rows therefore iterate in commit-ts, then start-ts, then
// row-key order, and the rows of one transaction are contiguous. Nothing but
// ordering fields lives in the key: flags (the value format version) are in
// the value header, so they can never perturb the order within a
// transaction (TiCDC's compression/mask bytes sit between start-ts and the
// row key, which is the mistake this layout avoids).
//
// Value layout:
//
//	version(1) | op(1) | uvarint(len(value)) | value | oldValue
const (
	subIDLen     = 8
	tsLen        = 8
	keyPrefixLen = subIDLen + 2*tsLen // bytes before the row key

	valueVersion1  byte = 1
	valueHeaderLen      = 2
)

// encodedKeyLen returns the length of the key of a row with the given row key.
func encodedKeyLen(rowKey []byte) int { return keyPrefixLen + len(rowKey) }

// encodeKey writes the key of (sub, row) into dst, which must be
// encodedKeyLen(row.Key) long.
func encodeKey(dst []byte, sub uint64, commitTs, startTs common.Ts, rowKey []byte) {
	binary.BigEndian.PutUint64(dst[0:], sub)
	binary.BigEndian.PutUint64(dst[8:], uint64(commitTs))
	binary.BigEndian.PutUint64(dst[16:], uint64(startTs))
	copy(dst[keyPrefixLen:], rowKey)
}

// appendKey appends the key of (sub, commitTs, startTs, rowKey) to dst.
func appendKey(dst []byte, sub uint64, commitTs, startTs common.Ts, rowKey []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, sub)
	dst = binary.BigEndian.AppendUint64(dst, uint64(commitTs))
	dst = binary.BigEndian.AppendUint64(dst, uint64(startTs))
	return append(dst, rowKey...)
}

// tsBoundary returns the smallest key of subscription sub with commit-ts ts:
// every row with commit-ts >= ts sorts at or after it, every row with
// commit-ts < ts sorts before it.
func tsBoundary(sub uint64, ts common.Ts) []byte {
	b := make([]byte, subIDLen+tsLen)
	binary.BigEndian.PutUint64(b[0:], sub)
	binary.BigEndian.PutUint64(b[8:], uint64(ts))
	return b
}

// subBoundary returns the smallest key of subscription sub.
func subBoundary(sub uint64) []byte {
	b := make([]byte, subIDLen)
	binary.BigEndian.PutUint64(b, sub)
	return b
}

// decodeKey splits a stored key into its fields. rowKey aliases key.
func decodeKey(key []byte) (sub uint64, commitTs, startTs common.Ts, rowKey []byte, err error) {
	if len(key) < keyPrefixLen {
		return 0, 0, 0, nil, fmt.Errorf("%w: key of %d bytes is shorter than its %d-byte prefix", ErrCorrupt, len(key), keyPrefixLen)
	}
	sub = binary.BigEndian.Uint64(key[0:])
	commitTs = common.Ts(binary.BigEndian.Uint64(key[8:]))
	startTs = common.Ts(binary.BigEndian.Uint64(key[16:]))
	return sub, commitTs, startTs, key[keyPrefixLen:], nil
}

// encodedValueLen returns the length of the value encoding of row.
func encodedValueLen(row *common.Row) int {
	return valueHeaderLen + uvarintLen(uint64(len(row.Value))) + len(row.Value) + len(row.OldValue)
}

// encodeValue writes the value encoding of row into dst, which must be
// encodedValueLen(row) long.
func encodeValue(dst []byte, row *common.Row) {
	dst[0] = valueVersion1
	dst[1] = byte(row.Op)
	n := valueHeaderLen + binary.PutUvarint(dst[valueHeaderLen:], uint64(len(row.Value)))
	n += copy(dst[n:], row.Value)
	copy(dst[n:], row.OldValue)
}

// decodeValue fills op, value and old value of row from v. The slices alias v.
func decodeValue(v []byte, row *common.Row) error {
	if len(v) < valueHeaderLen+1 {
		return fmt.Errorf("%w: value of %d bytes is too short", ErrCorrupt, len(v))
	}
	if v[0] != valueVersion1 {
		return fmt.Errorf("%w: unknown value version %d", ErrCorrupt, v[0])
	}
	op := common.OpType(v[1])
	if !op.Valid() {
		return fmt.Errorf("%w: unknown op %d", ErrCorrupt, v[1])
	}
	n, w := binary.Uvarint(v[valueHeaderLen:])
	if w <= 0 {
		return fmt.Errorf("%w: bad value length", ErrCorrupt)
	}
	rest := v[valueHeaderLen+w:]
	if n > uint64(len(rest)) {
		return fmt.Errorf("%w: value length %d exceeds the %d bytes left", ErrCorrupt, n, len(rest))
	}
	row.Op = op
	row.Value = nilIfEmpty(rest[:n])
	row.OldValue = nilIfEmpty(rest[n:])
	return nil
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}
