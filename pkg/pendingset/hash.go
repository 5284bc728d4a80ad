package pendingset

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"unsafe"
)

// hasher hashes the set's keys for its index. maphash.Comparable works for
// every comparable type but is a large part of an Add's cost (figures in
// docs/benchmarks.md, "Figures behind the code"). Most keys are small
// plain integers or structs of them (DispatcherID is two uint64s): for
// those, whose equality is exactly equality of their bytes, the hasher
// reads the 4, 8 or 16 bytes directly and mixes them with seeded 64-bit
// multiplications (wyhash's "mum": the high and low words of the 128-bit
// product, XORed). Every other type goes through maphash.
type hasher[K comparable] struct {
	seed maphash.Seed
	// size is how the key's bytes are read: 0 means maphash, else the
	// key's size in bytes (4, 8 or 16).
	size   uintptr
	s0, s1 uint64 // per-set secrets of the fast path
}

func newHasher[K comparable]() hasher[K] {
	h := hasher[K]{seed: maphash.MakeSeed(), s0: rand.Uint64() | 1, s1: rand.Uint64() | 1}
	if t := reflect.TypeFor[K](); plainBytes(t) {
		switch t.Size() {
		case 4, 8, 16:
			h.size = t.Size()
		}
	}
	return h
}

// plainBytes reports whether values of t are equal exactly when their
// bytes are: integers, booleans, and arrays and structs of them without
// padding. (Floats are not: -0 == +0 and NaN != NaN. Pointers, strings,
// interfaces and channels are left to maphash too.)
func plainBytes(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	case reflect.Array:
		return plainBytes(t.Elem())
	case reflect.Struct:
		var sum uintptr
		for i := range t.NumField() {
			f := t.Field(i)
			if !plainBytes(f.Type) {
				return false
			}
			sum += f.Type.Size()
		}
		return sum == t.Size() // no padding, whose bytes equality ignores
	}
	return false
}

// mum is the high and low words of a*b, XORed.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// hash returns k's 64-bit hash.
func (h *hasher[K]) hash(k *K) uint64 {
	p := unsafe.Pointer(k)
	switch h.size {
	case 16:
		return mum(mum(*(*uint64)(p)^h.s0, *(*uint64)(unsafe.Add(p, 8))^h.s1), h.s0^16)
	case 8:
		return mum(mum(*(*uint64)(p)^h.s0, h.s1^8), h.s0)
	case 4:
		return mum(mum(uint64(*(*uint32)(p))^h.s0, h.s1^4), h.s0)
	default:
		return maphash.Comparable(h.seed, *k)
	}
}
