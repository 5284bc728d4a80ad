package upstream

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

func TestOptionsDefaults(t *testing.T) {
	require.NoError(t, GeneratorOptions{}.Validate())
	d := GeneratorOptions{}.EnsureDefaults()
	require.Equal(t, DefaultTables, d.Tables)
	require.Equal(t, DefaultRowsPerSec, d.RowsPerSec)
	require.Equal(t, DefaultTxnRows, d.TxnRows)
	require.Equal(t, DefaultRowBytes, d.RowBytes)
	require.Equal(t, DefaultTables/100, d.HotTables)
	require.Equal(t, DefaultTxnsPerCommitTs, d.TxnsPerCommitTs)
	require.Equal(t, DefaultKeysPerTable, d.KeysPerTable)
	require.Equal(t, DefaultTick, d.Tick)
	require.Equal(t, DefaultPushRowsMax, d.PushRowsMax)
	require.Equal(t, DefaultResolvedGroupTables, d.ResolvedGroupTables)
	require.Zero(t, d.HotFraction)
	require.NotNil(t, d.Clock)
	require.NotNil(t, d.Logger)
	require.Equal(t, 1, GeneratorOptions{Tables: 50}.EnsureDefaults().HotTables, "HotTables is at least 1")
}

func TestOptionsValidateReportsEveryField(t *testing.T) {
	bad := GeneratorOptions{
		Tables:              -1,
		RowsPerSec:          -2,
		TxnRows:             -3,
		RowBytes:            maxRowBytes + 1,
		HotFraction:         1.5,
		HotTables:           -1,
		TxnsPerCommitTs:     -1,
		KeysPerTable:        -1,
		Tick:                1500 * time.Microsecond,
		PushRowsMax:         -1,
		StartTs:             100,
		ResolvedGroupTables: -1,
		EndTs:               50,
		Logger:              zap.NewNop(),
	}
	err := bad.Validate()
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, field := range []string{"Tables", "RowsPerSec", "TxnRows", "RowBytes", "HotFraction", "HotTables",
		"TxnsPerCommitTs", "KeysPerTable", "Tick", "PushRowsMax", "EndTs", "ResolvedGroupTables"} {
		require.Contains(t, err.Error(), field)
	}
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok)
	require.Len(t, joined.Unwrap(), 12)
	for _, e := range joined.Unwrap() {
		require.ErrorIs(t, e, ErrInvalidOptions)
	}

	g, err := NewGenerator(bad)
	require.Nil(t, g)
	require.ErrorIs(t, err, ErrInvalidOptions)
}

func TestOptionsValidateCrossFieldRules(t *testing.T) {
	cases := map[string]GeneratorOptions{
		"NaN fraction":           {HotFraction: math.NaN()},
		"negative fraction":      {HotFraction: -0.1},
		"hot tables > tables":    {Tables: 10, HotTables: 11},
		"no cold table":          {Tables: 4, HotTables: 4, HotFraction: 0.5},
		"keys below group size":  {TxnRows: 10, TxnsPerCommitTs: 3, KeysPerTable: 29},
		"tick below 1ms":         {Tick: time.Microsecond},
		"too many txns per tick": {RowsPerSec: 1 << 30, TxnRows: 1, Tick: time.Millisecond},
		"end not after start":    {StartTs: 100, EndTs: 100},
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			err := o.Validate()
			require.ErrorIs(t, err, ErrInvalidOptions)
			_, err = NewGenerator(o)
			require.ErrorIs(t, err, ErrInvalidOptions)
		})
	}
	// Boundaries that are valid.
	for _, o := range []GeneratorOptions{
		{Tables: 4, HotTables: 4, HotFraction: 1},
		{Tables: 1},
		{TxnRows: 10, TxnsPerCommitTs: 3, KeysPerTable: 30},
		{HotFraction: 1},
	} {
		require.NoError(t, o.Validate(), "%+v", o)
	}
}

func TestNewGeneratorEndTsBeforeDefaultStart(t *testing.T) {
	clock := clock.NewFake(t0)
	_, err := NewGenerator(GeneratorOptions{Clock: clock, EndTs: common.TsFromTime(t0.Add(-time.Second))})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.True(t, errors.Is(err, ErrInvalidOptions))
}
