package optcheck

import (
	"errors"
	"fmt"
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

type stringerForTest struct{}

func (*stringerForTest) String() string { return "x" }

func TestRequiredAndTypedNil(t *testing.T) {
	sentinel := errors.New("bad options")
	var typedNil fmt.Stringer = (*stringerForTest)(nil)
	var unset fmt.Stringer
	p := New(sentinel)
	p.Required("Set", &stringerForTest{})
	p.Required("Value", 3)
	p.NotTypedNil("Unset", unset)
	p.NotTypedNil("Set", &stringerForTest{})
	require.NoError(t, p.Err())

	p.Required("Missing", unset)
	p.Required("Store", typedNil)
	p.NotTypedNil("Clock", typedNil)
	p.Required("Func", (func())(nil))
	err := p.Err()
	require.ErrorIs(t, err, sentinel)
	require.Contains(t, err.Error(), "Missing is required")
	require.Contains(t, err.Error(), "Store is a nil *optcheck.stringerForTest")
	require.Contains(t, err.Error(), "Clock is a nil *optcheck.stringerForTest (leave it unset for the default)")
	require.Contains(t, err.Error(), "Func is a nil func()")
	require.True(t, IsNil(map[int]int(nil)))
	require.False(t, IsNil(0))
}
