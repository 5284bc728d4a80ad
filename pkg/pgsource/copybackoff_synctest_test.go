package pgsource

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// A chunk sent back is read again after the copy's back-off, on a real
// timer (the default clock) inside a synctest bubble, whose time moves
// only when every goroutine in it is blocked: 20ms doubling up to 2s, no
// jitter; a chunk that went in starts it over; the caller's cancel ends a
// wait with its error and the source's close with ErrClosed.
func TestTheCopysBackoffSpacesRereads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &Source{opts: Options{Clock: clock.OrReal(nil)}}
		s.ctx, s.cancel = context.WithCancel(context.Background())
		b := newCopyBackoff(s)
		waited := func(ctx context.Context) (time.Duration, error) {
			began := time.Now()
			err := b.wait(ctx)
			return time.Since(began), err
		}
		var got []time.Duration
		for range 9 {
			d, err := waited(context.Background())
			require.NoError(t, err)
			got = append(got, d)
		}
		ms := time.Millisecond
		require.Equal(t, []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, 1280 * ms, 2 * time.Second, 2 * time.Second}, got)

		b.reset()
		d, err := waited(context.Background())
		require.NoError(t, err)
		require.Equal(t, 20*ms, d, "a chunk that went in starts the back-off over")

		ctx, cancel := context.WithTimeout(context.Background(), 10*ms)
		defer cancel()
		d, err = waited(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, 10*ms, d, "the caller's deadline ends the wait")

		time.AfterFunc(5*ms, s.cancel)
		d, err = waited(context.Background())
		require.ErrorIs(t, err, ErrClosed)
		require.Equal(t, 5*ms, d, "the source's close ends the wait")
	})
}
