package messaging

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/cdcflow/eventservice/internal/optcheck"
)

// FaultOptions configures NewFaulty. Each Send draws one random number and
// is refused, failed, dropped or forwarded according to the rates, which are
// probabilities in [0, 1] whose sum is at most 1.
type FaultOptions struct {
	// Seed seeds the PCG source (Seed, 0); a seed reproduces the same
	// sequence of decisions for the same sequence of Sends.
	Seed uint64
	// RefuseRate: Send returns ErrBusy without delivering.
	RefuseRate float64
	// FailRate: Send returns an error wrapping ErrSendFailed without
	// delivering.
	FailRate float64
	// DropRate: Send returns nil but delivers nothing, so the receiver sees
	// a seq gap.
	DropRate float64
	// Delay, if set, is called at the start of every Send, before the
	// decision and with no lock held, so a test can block a send until it
	// chooses. It must not retain msgs.
	Delay func(target Target, msgs []Message)
}

// Validate reports every invalid field, each wrapping ErrInvalidOptions.
// FaultOptions has no defaults: a zero rate injects no fault of its kind.
func (o FaultOptions) Validate() error {
	var errs []error
	for _, r := range []struct {
		name string
		v    float64
	}{{"RefuseRate", o.RefuseRate}, {"FailRate", o.FailRate}, {"DropRate", o.DropRate}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			errs = append(errs, fmt.Errorf("%w: %s %v is not in [0, 1]", ErrInvalidOptions, r.name, r.v))
		}
	}
	if sum := o.RefuseRate + o.FailRate + o.DropRate; sum > 1 {
		errs = append(errs, fmt.Errorf("%w: rates sum to %v > 1", ErrInvalidOptions, sum))
	}
	return errors.Join(errs...)
}

// FaultStats counts what a Faulty did. Sends == Refused + Failed + Dropped +
// Forwarded once no Send is in flight.
type FaultStats struct {
	// Sends is the number of Send calls that reached the decision.
	Sends uint64
	// Refused, Failed and Dropped count injected faults, in calls.
	Refused, Failed, Dropped uint64
	// DroppedMessages counts the messages of dropped calls.
	DroppedMessages uint64
	// Forwarded counts calls passed to the inner transport (whatever it
	// then returned).
	Forwarded uint64
}

// Faulty wraps a Transport and injects refusals, failures and silent drops.
//
// INVARIANT: exactly one random number is drawn per Send, under mu, so the
// decision sequence depends only on the seed and the order of Sends.
// Lock order: mu is a leaf; it is released before the inner Send and never
// held while Delay runs.
type Faulty struct {
	inner Transport
	// Cumulative thresholds: u < refuse -> refuse; < fail -> fail; < drop -> drop.
	refuse, fail, drop float64
	delay              func(Target, []Message)

	mu struct {
		sync.Mutex
		rng   *rand.Rand
		stats FaultStats
	}
}

var (
	_ Transport    = (*Faulty)(nil)
	_ RoomNotifier = (*Faulty)(nil)
)

// NewFaulty wraps inner. Errors wrap ErrInvalidOptions (nil inner, rates out
// of range or summing above 1).
func NewFaulty(inner Transport, opts FaultOptions) (*Faulty, error) {
	var errs []error
	if optcheck.IsNil(inner) {
		// A typed nil too ((*InProcess)(nil)): it would panic at the
		// first Send, in the sender's goroutine.
		errs = append(errs, fmt.Errorf("%w: nil inner transport (%T)", ErrInvalidOptions, inner))
	}
	if err := opts.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	f := &Faulty{
		inner:  inner,
		refuse: opts.RefuseRate,
		fail:   opts.RefuseRate + opts.FailRate,
		drop:   opts.RefuseRate + opts.FailRate + opts.DropRate,
		delay:  opts.Delay,
	}
	f.mu.rng = rand.New(rand.NewPCG(opts.Seed, 0))
	return f, nil
}

// faultDecision is what one Send does.
type faultDecision uint8

const (
	decideForward faultDecision = iota
	decideRefuse
	decideFail
	decideDrop
)

// decide draws the fate of one Send and counts it.
func (f *Faulty) decide(n int) faultDecision {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.stats.Sends++
	switch u := f.mu.rng.Float64(); {
	case u < f.refuse:
		f.mu.stats.Refused++
		return decideRefuse
	case u < f.fail:
		f.mu.stats.Failed++
		return decideFail
	case u < f.drop:
		f.mu.stats.Dropped++
		f.mu.stats.DroppedMessages += uint64(n)
		return decideDrop
	default:
		f.mu.stats.Forwarded++
		return decideForward
	}
}

// Send implements Transport: Delay, then one decision, then (if forwarded)
// the inner Send.
func (f *Faulty) Send(target Target, msgs []Message) error {
	if f.delay != nil {
		f.delay(target, msgs)
	}
	switch f.decide(len(msgs)) {
	case decideRefuse:
		return ErrBusy
	case decideFail:
		return fmt.Errorf("%w: injected failure sending %d messages to %q", ErrSendFailed, len(msgs), target)
	case decideDrop:
		return nil
	default:
		return f.inner.Send(target, msgs)
	}
}

// Room implements RoomNotifier by asking the inner transport; an inner
// transport without it, like an injected refusal, has room at once (the
// refusal was a fault, not a full queue).
func (f *Faulty) Room(target Target) <-chan struct{} {
	if rn, ok := f.inner.(RoomNotifier); ok {
		return rn.Room(target)
	}
	return closedRoom()
}

// HasRoom implements RoomNotifier by asking the inner transport; one
// without it always has room, as for Room.
func (f *Faulty) HasRoom(target Target) bool {
	if rn, ok := f.inner.(RoomNotifier); ok {
		return rn.HasRoom(target)
	}
	return true
}

// Stats returns a snapshot of the counters.
func (f *Faulty) Stats() FaultStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.stats
}
