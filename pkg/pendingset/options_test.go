package pendingset

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Validate reports every bad field at once, each wrapping ErrInvalidOptions.
func TestOptionsValidateReportsEveryField(t *testing.T) {
	o := Options[int, uint64]{
		MaxBatch:        -1,
		BackoffBase:     -time.Second,
		BackoffMax:      -time.Second,
		Jitter:          1.5,
		MaxAttempts:     -2,
		QuarantineRetry: -time.Second,
		MetricsPrefix:   "9bad-name",
		ConstLabels:     prometheus.Labels{"__reserved": "x", "ok": "y", "a:b": "z"},
	}
	err := o.Validate()
	require.ErrorIs(t, err, ErrInvalidOptions)
	var joined interface{ Unwrap() []error }
	require.True(t, errors.As(err, &joined))
	for _, e := range joined.Unwrap() {
		require.ErrorIs(t, e, ErrInvalidOptions)
	}
	for _, field := range []string{"Merge", "MaxBatch", "BackoffBase", "BackoffMax", "Jitter",
		"MaxAttempts", "QuarantineRetry", "MetricsPrefix", `"__reserved"`, `"a:b"`} {
		require.Contains(t, err.Error(), field)
	}
	require.NotContains(t, err.Error(), `"ok"`)
	require.Len(t, joined.Unwrap(), 10)

	_, err = New(o)
	require.ErrorIs(t, err, ErrInvalidOptions)

	// Base above Max is caught, also against a defaulted Max, and NaN jitter.
	err = Options[int, uint64]{Merge: maxMerge, BackoffBase: time.Minute}.Validate()
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "exceeds BackoffMax 5s")
	require.ErrorIs(t, Options[int, uint64]{Merge: maxMerge, Jitter: math.NaN()}.Validate(), ErrInvalidOptions)
}

func TestOptionsDefaults(t *testing.T) {
	o := Options[int, uint64]{Merge: maxMerge}
	require.NoError(t, o.Validate())
	d := o.EnsureDefaults()
	require.Equal(t, DefaultMaxBatch, d.MaxBatch)
	require.Equal(t, DefaultBackoffBase, d.BackoffBase)
	require.Equal(t, DefaultBackoffMax, d.BackoffMax)
	require.Equal(t, DefaultJitter, d.Jitter)
	require.Equal(t, DefaultMaxAttempts, d.MaxAttempts)
	require.Equal(t, DefaultQuarantineRetry, d.QuarantineRetry)
	require.Equal(t, DefaultMetricsPrefix, d.MetricsPrefix)
	require.NotNil(t, d.Clock)
	require.NotNil(t, d.Rand)
	require.NotNil(t, d.Logger)
	require.Nil(t, d.Bypass)
	u := d.Rand()
	require.True(t, u >= 0 && u < 1)

	// A real-clock set works end to end.
	s, err := New(o)
	require.NoError(t, err)
	s.Add(1, 1)
	b := s.Drain(0, nil)
	require.Len(t, b, 1)
	require.NoError(t, s.Complete(b, nil))
	require.False(t, s.Unregister(), "no Registerer, nothing to unregister")
}

func TestStateAndResultStrings(t *testing.T) {
	var names []string
	for st := range numStates + 1 {
		names = append(names, st.String())
	}
	require.Equal(t, "idle ready in-flight backoff quarantined state(5)", strings.Join(names, " "))
	require.Equal(t, "delivered failed-key retry-key", strings.Join([]string{Delivered.String(), FailedKey.String(), RetryKey.String()}, " "))
}
