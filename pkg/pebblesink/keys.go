package pebblesink

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Keys of the sink's layout (the Sink type's comment, sink.go): a table's
// newest commit-ts under 'm', its DDLs under 'd', its row versions under
// 'v' with the row key escaped so that a key's versions sort together and
// by commit-ts.

func newestKey(table int64) []byte { return binary.BigEndian.AppendUint64([]byte{'m'}, uint64(table)) }

func ddlKey(table int64, commitTs common.Ts) []byte {
	k := binary.BigEndian.AppendUint64([]byte{'d'}, uint64(table))
	return binary.BigEndian.AppendUint64(k, uint64(commitTs))
}

// versionKeyOverhead is what a version key adds to its row's key when the
// key holds no zero byte (each zero byte adds one more).
const versionKeyOverhead = 1 + 8 + 2 + 8

func versionKey(table int64, key []byte, commitTs common.Ts) []byte {
	return appendVersionKey(make([]byte, 0, versionKeyOverhead+len(key)), table, key, commitTs)
}

// appendVersionKey appends versionKey(table, key, commitTs) to dst.
func appendVersionKey(dst []byte, table int64, key []byte, commitTs common.Ts) []byte {
	dst = append(dst, 'v')
	dst = binary.BigEndian.AppendUint64(dst, uint64(table))
	dst = appendEscaped(dst, key)
	return binary.BigEndian.AppendUint64(dst, uint64(commitTs))
}

// keyGroup is a set of keys: the versions staged at one commit-ts. A
// commit-ts holds a transaction's rows of one table, a few as a rule, so
// the first keyGroupScan keys are compared in a list, without the copy a
// map insert makes; a larger group moves to a map.
type keyGroup struct {
	buf  []byte // the listed keys, back to back
	ends []int  // ends[i] is where key i ends in buf
	big  map[string]struct{}
}

const keyGroupScan = 8

// add adds k and reports whether it was new.
func (g *keyGroup) add(k []byte) bool {
	if g.big != nil && len(g.ends) > keyGroupScan {
		if _, dup := g.big[string(k)]; dup {
			return false
		}
		g.big[string(k)] = struct{}{}
		return true
	}
	start := 0
	for _, end := range g.ends {
		if bytes.Equal(g.buf[start:end], k) {
			return false
		}
		start = end
	}
	g.buf = append(g.buf, k...)
	g.ends = append(g.ends, len(g.buf))
	if len(g.ends) > keyGroupScan {
		if g.big == nil {
			g.big = map[string]struct{}{}
		}
		start = 0
		for _, end := range g.ends {
			g.big[string(g.buf[start:end])] = struct{}{}
			start = end
		}
	}
	return true
}

// reset empties g, keeping its memory.
func (g *keyGroup) reset() {
	g.buf, g.ends = g.buf[:0], g.ends[:0]
	clear(g.big)
}

// appendEscaped appends key with each 0x00 written as 0x00 0xFF and the
// terminator 0x00 0x01. Order is preserved: a byte above 0x00 compares as
// itself; 0x00 0xFF (a zero byte) sorts above 0x00 0x01 (the end), so a
// key sorts before every longer key it prefixes, whatever follows.
func appendEscaped(dst, key []byte) []byte {
	for {
		i := bytes.IndexByte(key, 0)
		if i < 0 {
			break
		}
		dst = append(dst, key[:i+1]...)
		dst = append(dst, 0xFF)
		key = key[i+1:]
	}
	dst = append(dst, key...)
	return append(dst, 0x00, 0x01)
}

// decodeEscaped reads an escaped key off the front of b, returning the key
// and what follows its terminator.
func decodeEscaped(b []byte) (key, rest []byte, err error) {
	for {
		i := bytes.IndexByte(b, 0)
		if i < 0 || i+1 == len(b) {
			return nil, nil, fmt.Errorf("%w: escaped key without its terminator", ErrCorruptSink)
		}
		key = append(key, b[:i]...)
		switch b[i+1] {
		case 0x01:
			if key == nil {
				key = []byte{} // an empty key is a key, not an absent one
			}
			return key, b[i+2:], nil
		case 0xFF:
			key = append(key, 0)
			b = b[i+2:]
		default:
			return nil, nil, fmt.Errorf("%w: escaped key with 0x00 %#02x", ErrCorruptSink, b[i+1])
		}
	}
}
