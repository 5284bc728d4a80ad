package pendingset

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// Defaults applied by EnsureDefaults to zero-valued fields.
const (
	DefaultMaxBatch        = 512
	DefaultBackoffBase     = 10 * time.Millisecond
	DefaultBackoffMax      = 5 * time.Second
	DefaultJitter          = 0.2
	DefaultMaxAttempts     = 10
	DefaultQuarantineRetry = 30 * time.Second
	DefaultBisectAfter     = 8
	DefaultMetricsPrefix   = "pendingset"
)

// Options configure a Set. The zero value of every field except Merge
// selects the documented default; New applies EnsureDefaults and Validate.
type Options[K comparable, V any] struct {
	// Merge combines a key's undelivered value with a newer one: old is the
	// value already held, new the one being added (or, when a failed
	// delivery merges back, old is the value that failed and new the value
	// added while it was in flight). Required. It runs under the set's lock:
	// it must be fast and must not call the Set.
	Merge func(old, new V) V

	// MaxBatch is the batch size the Pump drains, and Drain's limit when it
	// is given max <= 0. Default 512.
	MaxBatch int

	// Supersedes, if set, makes the newest value win across deliveries, for
	// keys with several writers ("newest wins" by version or phase): the
	// set keeps the value last delivered for each key while the key keeps
	// its slot (a delivered key's idle slot is reused, oldest first, only
	// when a key never seen before needs one; the key then forgets what it
	// delivered, which bounds memory by the keys held, as without the
	// option), and a value v added after it, or while it was in flight,
	// is delivered only if Supersedes(v, delivered) is true; otherwise it
	// is dropped (Stats.Superseded). Merge still combines undelivered
	// values. Nil, the default, delivers every value added after a
	// delivery, whatever its age. Runs under the set's lock.
	Supersedes func(v, delivered V) bool

	// Size and MaxBatchBytes bound a batch by bytes as well as by count:
	// Drain stops before the entry that would take the batch's summed Size
	// over MaxBatchBytes (a batch always holds at least one entry, however
	// large). Size runs under the set's lock: it must be fast and must not
	// call the Set. Both unset (the default) means count only; setting one
	// without the other is invalid.
	Size          func(key K, v V) int
	MaxBatchBytes int

	// BackoffBase and BackoffMax bound the exponential backoff: the n-th
	// consecutive failure waits BackoffBase*2^(n-1), capped at BackoffMax.
	// It applies per key (per-key failures) and to the pump (whole-batch
	// failures). Defaults 10ms and 5s.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// Jitter is the fraction by which each delay is randomly shortened: a
	// delay d becomes d*(1-Jitter*u) with u drawn from Rand, so jitter never
	// exceeds the cap and spreads keys that failed together. In [0,1];
	// 0 selects the default 0.2 (inject a Rand returning 0 for exact delays).
	Jitter float64

	// Rand returns a number in [0,1) for jitter. It runs under the set's
	// lock (and on the pump goroutine). Default math/rand/v2.Float64.
	Rand func() float64

	// MaxAttempts is the number of per-key (budgeted) failures after which
	// a key is quarantined. The count survives merges and new adds and is
	// reset only by a successful delivery. Default 10.
	MaxAttempts int

	// QuarantineRetry is how long a quarantined key waits before it is
	// re-admitted for one more attempt. Default 30s.
	QuarantineRetry time.Duration

	// MaxInFlight is how many batches the pump delivers at once. One, the
	// default, keeps delivery on the pump's goroutine; more start up to
	// MaxInFlight delivery goroutines (the DeliverFunc then runs
	// concurrently with itself), which lifts the cap of MaxBatch per round
	// trip. Batches in flight hold disjoint keys, so per-key order holds.
	MaxInFlight int

	// DeliveryTimeout bounds one call of the pump's DeliverFunc: its
	// context is cancelled after this long (on Clock), and the batch fails
	// as a whole, wrapping ErrDeliveryTimeout. Zero, the default, means no
	// bound beyond the pump's lifetime.
	DeliveryTimeout time.Duration

	// BisectAfter is the number of consecutive whole-batch failures (other
	// than ErrBusy) after which the pump stops retrying the batch as a
	// whole and bisects it, as it always does at once for a failure that
	// wraps ErrPermanent: each half is delivered on its own, recursively,
	// so one bad key cannot wedge the pump. A key that still fails alone
	// gets RetryKey (no budget) after repeated failures, FailedKey (budget,
	// then quarantine) after a permanent one. Default 8; negative turns
	// bisection of repeated failures off (permanent ones are still
	// bisected).
	BisectAfter int

	// Bypass, if set, decides whether a fresh value may skip the remaining
	// backoff of a key that failed: it is called with the value that waits
	// (merged) and the fresh one, when an Add reaches a backing-off key or
	// when a value added during a failed delivery merges back. Returning
	// true makes the key ready at once (it keeps its attempt count). Nil,
	// the default, means a backoff is always served in full; quarantine is
	// never bypassed. See the package documentation for why.
	Bypass func(waiting, fresh V) bool

	// Clock supplies time. Default: the real clock.
	Clock clock.Clock

	// Registerer receives the set's metrics. Nil registers nothing; Stats
	// works either way.
	Registerer prometheus.Registerer
	// MetricsPrefix prefixes every metric name. Default "pendingset".
	MetricsPrefix string
	// ConstLabels are attached to every metric, so that several sets (one
	// per target, say) can share a Registerer. Never put keys here.
	ConstLabels prometheus.Labels

	// Logger receives quarantine and misuse reports. Default zap.NewNop().
	Logger *zap.Logger
}

// EnsureDefaults returns a copy of o with every zero-valued field set to
// its default. Merge, Bypass, Registerer and ConstLabels have none.
func (o Options[K, V]) EnsureDefaults() Options[K, V] {
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.BackoffBase == 0 {
		o.BackoffBase = DefaultBackoffBase
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.Jitter == 0 {
		o.Jitter = DefaultJitter
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.QuarantineRetry == 0 {
		o.QuarantineRetry = DefaultQuarantineRetry
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 1
	}
	if o.BisectAfter == 0 {
		o.BisectAfter = DefaultBisectAfter
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.MetricsPrefix == "" {
		o.MetricsPrefix = DefaultMetricsPrefix
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports every invalid field at once (errors.Join), each error
// wrapping ErrInvalidOptions. Zero values are valid (they mean "default");
// the checks run on the defaulted copy, so BackoffBase <= BackoffMax is
// checked against the defaults too.
func (o Options[K, V]) Validate() error {
	d := o.EnsureDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if o.Merge == nil {
		bad("Merge is required")
	}
	if o.MaxBatch < 0 {
		bad("MaxBatch %d is negative", o.MaxBatch)
	}
	if o.MaxInFlight < 0 {
		bad("MaxInFlight %d is negative", o.MaxInFlight)
	}
	if o.DeliveryTimeout < 0 {
		bad("DeliveryTimeout %v is negative", o.DeliveryTimeout)
	}
	if o.MaxBatchBytes < 0 {
		bad("MaxBatchBytes %d is negative", o.MaxBatchBytes)
	}
	if (o.Size == nil) != (o.MaxBatchBytes == 0) {
		bad("Size and MaxBatchBytes go together (Size set: %v, MaxBatchBytes %d)", o.Size != nil, o.MaxBatchBytes)
	}
	if o.BackoffBase < 0 {
		bad("BackoffBase %v is negative", o.BackoffBase)
	}
	if o.BackoffMax < 0 {
		bad("BackoffMax %v is negative", o.BackoffMax)
	}
	if o.BackoffBase >= 0 && o.BackoffMax >= 0 && d.BackoffBase > d.BackoffMax {
		bad("BackoffBase %v exceeds BackoffMax %v", d.BackoffBase, d.BackoffMax)
	}
	if !(o.Jitter >= 0 && o.Jitter <= 1) { // also rejects NaN
		bad("Jitter %v is outside [0,1]", o.Jitter)
	}
	if o.MaxAttempts < 0 {
		bad("MaxAttempts %d is negative", o.MaxAttempts)
	}
	if o.QuarantineRetry < 0 {
		bad("QuarantineRetry %v is negative", o.QuarantineRetry)
	}
	if !validMetricName(d.MetricsPrefix) {
		bad("MetricsPrefix %q is not a valid metric name", o.MetricsPrefix)
	}
	for name := range o.ConstLabels {
		if !validLabelName(name) {
			bad("ConstLabels name %q is not a valid label name", name)
		}
	}
	return errors.Join(errs...)
}

// validMetricName reports whether s matches [a-zA-Z_:][a-zA-Z0-9_:]*.
func validMetricName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		letter := r == '_' || r == ':' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !letter && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// validLabelName reports whether s matches [a-zA-Z_][a-zA-Z0-9_]* and is not
// reserved (a leading "__").
func validLabelName(s string) bool {
	if len(s) >= 2 && s[:2] == "__" {
		return false
	}
	return !strings.ContainsRune(s, ':') && validMetricName(s)
}
