package optcheck

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProblems(t *testing.T) {
	sentinel := errors.New("bad options")
	p := New(sentinel)
	require.NoError(t, p.Err())
	p.Require(true, "never")
	p.IntRange("Workers", 3, 1, 8)
	require.NoError(t, p.Err())
	p.Require(false, "Store is required")
	p.IntRange("Workers", 0, 1, 8)
	err := p.Err()
	require.ErrorIs(t, err, sentinel)
	require.Contains(t, err.Error(), "Store is required")
	require.Contains(t, err.Error(), "Workers 0 not in [1, 8]")
}
