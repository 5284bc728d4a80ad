package promrefs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A rule file's expressions are read inline and as blocks, comments left
// out, a histogram's series under its family, each name once; an empty
// block is an error.
func TestRuleMetricsReadsInlineAndBlockExpressions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yml")
	require.NoError(t, os.WriteFile(path, []byte(`groups:
  - name: g
    rules:
      - alert: A
        expr: cdcflow_a > 1 or up == 0
      - alert: B
        expr: |
          histogram_quantile(0.99, rate(cdcflow_b_seconds_bucket[5m])) # not cdcflow_comment
            and cdcflow_a > 0
        for: 1m
`), 0o600))
	names, err := RuleMetrics(path)
	require.NoError(t, err)
	require.Equal(t, []string{"cdcflow_a", "cdcflow_b_seconds"}, names)

	require.NoError(t, os.WriteFile(path, []byte("      - alert: C\n        expr: |\n      - alert: D\n"), 0o600))
	_, err = RuleMetrics(path)
	require.ErrorIs(t, err, ErrBadFile)
}
