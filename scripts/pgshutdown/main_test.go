package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A held-up shutdown is shown as past the limit, never as a figure; the
// cell is the median of the runs.
func TestTheTableShowsMediansAndHeldUpShutdowns(t *testing.T) {
	res := map[string][]time.Duration{
		"native/smart, idle":       {100 * time.Millisecond, 300 * time.Millisecond, 200 * time.Millisecond},
		"cdcflow/smart, idle":      {60 * time.Second},
		"cdcflow/fast, under load": {250 * time.Millisecond},
		"native/fast, under load":  {520 * time.Millisecond},
	}
	table := render(res, options{limit: 60 * time.Second})
	lines := strings.Split(table, "\n")
	require.Contains(t, lines[1], "0.20")
	require.Contains(t, lines[1], "> 60")
	require.Contains(t, lines[2], "-")
	require.Contains(t, lines[3], "0.52")
	require.Contains(t, lines[3], "0.25")
}
