package pgsource

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A DDL capture message comes from the source database: whatever it holds,
// reading it never panics, and what reads names a table and positive
// column numbers.
func FuzzParseCapture(f *testing.F) {
	for _, s := range []string{`{"oid": 16384, "columns": [{"num": 1, "name": "id"}, {"num": 2, "name": "a"}]}`,
		`{"oid": 16384, "dropped": true}`, `{"oid": 0}`, `{"oid": 1, "columns": [{"num": -1, "name": "x"}]}`, `{`, `null`, `{"oid": "16384"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		oid, shape, err := parseCapture(b)
		nums := shape.nums
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		require.NotZero(t, oid)
		for name, n := range nums {
			require.Positive(t, n, name)
			require.NotEmpty(t, name)
		}
	})
}
