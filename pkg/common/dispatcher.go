package common

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
)

// DispatcherID identifies one dispatcher (one table span of one changefeed).
// It is a comparable 128-bit value, cheap to copy and to hash.
type DispatcherID struct {
	Hi, Lo uint64
}

// NewDispatcherID returns a random ID drawn from r.
func NewDispatcherID(r *rand.Rand) DispatcherID {
	return DispatcherID{Hi: r.Uint64(), Lo: r.Uint64()}
}

// DispatcherIDFromUint64 returns an ID whose low word is n; handy in tests
// and in the demo server, where dispatchers are numbered.
func DispatcherIDFromUint64(n uint64) DispatcherID { return DispatcherID{Lo: n} }

// IsZero reports whether id is the zero ID, which no dispatcher may use.
func (id DispatcherID) IsZero() bool { return id == DispatcherID{} }

// Hash mixes both words into a well-distributed 64-bit value (a
// splitmix64-style finaliser), so sequential IDs spread over workers.
func (id DispatcherID) Hash() uint64 { return Mix64(id.Hi*0x9e3779b97f4a7c15 ^ id.Lo) }

// SeededHash hashes id under seed, for a hash table whose keys a peer
// chooses (an ID from the network): each word is mixed with its own half
// of the seed, so without the seed no set of IDs can be chosen to share
// a bucket. Two distinct IDs of equal Hi never collide (the mixing is a
// bijection of Lo).
func (id DispatcherID) SeededHash(seed uint64) uint64 {
	return Mix64(Mix64(id.Hi^seed) ^ id.Lo ^ seed*0x9e3779b97f4a7c15)
}

// Mix64 is splitmix64's finaliser, a bijection that sends each input bit
// to every output bit (the one mixer the module's hashes share).
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Index returns id's worker index in [0, n). n must be positive.
func (id DispatcherID) Index(n int) int { return int(id.Hash() % uint64(n)) }

// Bytes returns the 16-byte big-endian encoding of id.
func (id DispatcherID) Bytes() [16]byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], id.Hi)
	binary.BigEndian.PutUint64(b[8:], id.Lo)
	return b
}

// String formats id as 32 hex digits.
func (id DispatcherID) String() string { return fmt.Sprintf("%016x%016x", id.Hi, id.Lo) }
