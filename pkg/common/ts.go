package common

import (
	"fmt"
	"time"
)

// LogicalBits is the number of low bits of a Ts that hold the logical counter.
const LogicalBits = 18

// MaxLogical is the largest logical part a Ts can carry.
const MaxLogical = 1<<LogicalBits - 1

// Ts is a TSO-style timestamp: physical milliseconds since the Unix epoch
// shifted left by LogicalBits, ORed with a logical counter. Ts values compare
// like the integers they are; zero means "unset".
type Ts uint64

// ComposeTs builds a Ts from physical milliseconds and a logical counter. The
// logical part is masked to LogicalBits bits.
func ComposeTs(physicalMs int64, logical int64) Ts {
	return Ts(uint64(physicalMs)<<LogicalBits | uint64(logical)&MaxLogical)
}

// TsFromTime returns the Ts of t with logical part zero.
func TsFromTime(t time.Time) Ts {
	return ComposeTs(t.UnixMilli(), 0)
}

// PhysicalMs returns the physical part in milliseconds since the Unix epoch.
func (t Ts) PhysicalMs() int64 { return int64(uint64(t) >> LogicalBits) }

// Logical returns the logical counter.
func (t Ts) Logical() int64 { return int64(uint64(t) & MaxLogical) }

// Physical returns the physical part as a time.Time.
func (t Ts) Physical() time.Time { return time.UnixMilli(t.PhysicalMs()) }

// Lag returns how far t's physical time is behind now; zero if t is ahead.
func (t Ts) Lag(now time.Time) time.Duration {
	d := now.Sub(t.Physical())
	if d < 0 {
		return 0
	}
	return d
}

// String formats the Ts as its integer value and its physical/logical parts.
func (t Ts) String() string {
	return fmt.Sprintf("%d(%d.%d)", uint64(t), t.PhysicalMs(), t.Logical())
}
