package upstream

import (
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

// Defaults of GeneratorOptions. A zero field means "use the default".
const (
	DefaultTables          = 1000
	DefaultRowsPerSec      = 10000
	DefaultTxnRows         = 4
	DefaultRowBytes        = 100
	DefaultTxnsPerCommitTs = 2
	DefaultKeysPerTable    = 100_000
	DefaultTick            = 10 * time.Millisecond
	DefaultPushRowsMax     = 1024
	// DefaultResolvedGroupTables: each table crosses its resolved-ts
	// interval boundaries in a phase of its own.
	DefaultResolvedGroupTables = 1

	// maxRowBytes bounds RowBytes so a typo cannot make every row allocate
	// gigabytes.
	maxRowBytes = 16 << 20
)

// GeneratorOptions configure a synthetic workload. Every field that is zero
// takes the documented default, so GeneratorOptions{Seed: 7} is a complete
// configuration. Two Generators with equal options (after defaults, including
// StartTs) produce identical rows.
type GeneratorOptions struct {
	// Tables is the number of tables; their IDs are 1..Tables. Default 1000.
	Tables int
	// RowsPerSec is the long-run row rate summed over all tables.
	// Default 10000.
	RowsPerSec int
	// TxnRows is the number of rows of every transaction. Default 4.
	TxnRows int
	// RowBytes is the size of the value of a put row. Default 100, at most
	// 16 MiB.
	RowBytes int
	// HotFraction is the fraction of all rows that land on the hot tables,
	// in [0, 1]. Zero (the default) means uniform: every table gets the same
	// share and no table is special.
	HotFraction float64
	// HotTables is how many tables are hot; the hot tables are IDs
	// 1..HotTables. Default max(1, Tables/100). A HotFraction strictly
	// between 0 and 1 needs at least one cold table.
	HotTables int
	// TxnsPerCommitTs is the largest number of transactions that share one
	// commit-ts (with different start-ts). Default 2.
	TxnsPerCommitTs int
	// KeysPerTable bounds each table's key space, so later transactions
	// update and delete keys written by earlier ones. Default 100000; at
	// least TxnRows*TxnsPerCommitTs, because a commit-ts group never writes
	// the same key twice.
	KeysPerTable int
	// Seed selects the workload. Zero is a valid seed.
	Seed uint64
	// Tick is the time granularity: rows are generated per tick and the
	// frontier advances by whole ticks. A whole number of milliseconds.
	// Default 10ms.
	Tick time.Duration
	// StartTs is where the workload begins: no row has commit-ts <= StartTs.
	// Zero (the default) means the end of the tick before the one Clock.Now
	// falls in when NewGenerator runs. Set it explicitly when two Generators
	// (for example before and after a restart) must produce the same rows.
	StartTs common.Ts
	// EndTs, if not zero, ends the workload: no row has commit-ts > EndTs,
	// and the frontier stops exactly at EndTs.
	EndTs common.Ts
	// PushRowsMax is the largest number of rows in one Batch pushed to a
	// sink, so a catch-up is chunked. Default 1024.
	PushRowsMax int
	// ResolvedInterval is how often one subscription's resolved-ts
	// advances, as a real upstream's does (TiKV advances it about once a
	// second; TiCDC's event store asks for AdvanceIntervalInMs). Rows are
	// still pushed every tick; a push carries a resolved-ts only when the
	// subscription's interval boundary (staggered by table, or by group of
	// tables with ResolvedGroupTables, so the advances spread over the
	// interval) has passed, and always at EndTs.
	// Default 0: every tick.
	ResolvedInterval time.Duration
	// ResolvedGroupTables is how many tables share one phase of
	// ResolvedInterval: the tables whose IDs divided by it are equal cross
	// their interval boundaries together, as the tables of one TiKV
	// region do (a region is a contiguous key range, and small tables with
	// adjacent IDs share one; a PostgreSQL source advances every table at
	// once). The groups' phases spread over the interval. Default 1: each
	// table has a phase of its own.
	ResolvedGroupTables int
	// OnFrontier, if set, is called by the feeding goroutine with the new
	// frontier each time it moves, before any subscription is fed up to
	// it. It keeps what must run ahead of the feed in step with it, as a
	// real upstream's DDLs share the log of its rows: cdcserver advances
	// its schema store here, so no table's resolved-ts waits on a schema
	// frontier of another phase. Calls come from one goroutine, in
	// increasing order, each above StartTs; one may be in progress while
	// Close runs, none after Close returns. It must return quickly and must
	// not call the Generator's Close. Default nil.
	OnFrontier func(frontier common.Ts)
	// Clock is the time source. Default: the real clock.
	Clock clock.Clock
	// Logger receives push failures. Default zap.NewNop().
	Logger *zap.Logger
}

// EnsureDefaults returns a copy of o with every zero field set to its default.
// StartTs stays zero here: its default depends on the clock and is resolved
// by NewGenerator.
func (o GeneratorOptions) EnsureDefaults() GeneratorOptions {
	if o.Tables == 0 {
		o.Tables = DefaultTables
	}
	if o.RowsPerSec == 0 {
		o.RowsPerSec = DefaultRowsPerSec
	}
	if o.TxnRows == 0 {
		o.TxnRows = DefaultTxnRows
	}
	if o.RowBytes == 0 {
		o.RowBytes = DefaultRowBytes
	}
	if o.HotTables == 0 {
		o.HotTables = max(1, o.Tables/100)
	}
	if o.TxnsPerCommitTs == 0 {
		o.TxnsPerCommitTs = DefaultTxnsPerCommitTs
	}
	if o.KeysPerTable == 0 {
		o.KeysPerTable = DefaultKeysPerTable
	}
	if o.Tick == 0 {
		o.Tick = DefaultTick
	}
	if o.PushRowsMax == 0 {
		o.PushRowsMax = DefaultPushRowsMax
	}
	if o.ResolvedGroupTables == 0 {
		o.ResolvedGroupTables = DefaultResolvedGroupTables
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports every invalid field at once: the result joins one error
// per problem, each wrapping ErrInvalidOptions. Zero fields are valid (they
// take defaults); Validate checks the defaulted values.
func (o GeneratorOptions) Validate() error {
	d := o.EnsureDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if o.ResolvedInterval < 0 {
		bad("ResolvedInterval %v is negative", o.ResolvedInterval)
	}
	if o.ResolvedGroupTables < 0 {
		bad("ResolvedGroupTables %d is negative", o.ResolvedGroupTables)
	}
	if o.Clock != nil && optcheck.IsNil(o.Clock) {
		bad("Clock is a nil %T (leave it unset for the default)", o.Clock)
	}
	if d.Tables < 0 {
		bad("Tables %d is negative", d.Tables)
	}
	if d.RowsPerSec < 0 {
		bad("RowsPerSec %d is negative", d.RowsPerSec)
	}
	if d.TxnRows < 0 {
		bad("TxnRows %d is negative", d.TxnRows)
	}
	if d.RowBytes < 0 || d.RowBytes > maxRowBytes {
		bad("RowBytes %d is outside [1, %d]", d.RowBytes, maxRowBytes)
	}
	if math.IsNaN(d.HotFraction) || d.HotFraction < 0 || d.HotFraction > 1 {
		bad("HotFraction %v is outside [0, 1]", d.HotFraction)
	}
	if d.HotTables < 0 || (d.Tables > 0 && d.HotTables > d.Tables) {
		bad("HotTables %d is outside [1, Tables=%d]", d.HotTables, d.Tables)
	} else if d.HotFraction > 0 && d.HotFraction < 1 && d.HotTables == d.Tables {
		bad("HotFraction %v needs a cold table but HotTables == Tables == %d", d.HotFraction, d.Tables)
	}
	if d.TxnsPerCommitTs < 0 {
		bad("TxnsPerCommitTs %d is negative", d.TxnsPerCommitTs)
	}
	if d.KeysPerTable < 0 {
		bad("KeysPerTable %d is negative", d.KeysPerTable)
	} else if d.TxnRows > 0 && d.TxnsPerCommitTs > 0 && d.KeysPerTable < d.TxnRows*d.TxnsPerCommitTs {
		bad("KeysPerTable %d is below TxnRows*TxnsPerCommitTs = %d", d.KeysPerTable, d.TxnRows*d.TxnsPerCommitTs)
	}
	if d.Tick < time.Millisecond || d.Tick%time.Millisecond != 0 {
		bad("Tick %v is not a positive whole number of milliseconds", d.Tick)
	} else if d.RowsPerSec > 0 && d.TxnRows > 0 {
		// Every transaction of a tick takes one start-ts and at most one
		// commit-ts inside the tick, so the busiest table's transactions
		// must fit in the tick's Tick<<LogicalBits timestamps.
		maxTxns := math.Ceil(float64(d.RowsPerSec)*d.Tick.Seconds()/float64(d.TxnRows)) + 1
		if capacity := float64(d.Tick.Milliseconds() << common.LogicalBits); 2*maxTxns+2 > capacity {
			bad("RowsPerSec %d needs up to %.0f transactions per tick, more than the %.0f timestamps of a %v tick allow",
				d.RowsPerSec, maxTxns, capacity/2, d.Tick)
		}
	}
	if d.PushRowsMax < 0 {
		bad("PushRowsMax %d is negative", d.PushRowsMax)
	}
	if d.StartTs != 0 && d.EndTs != 0 && d.EndTs <= d.StartTs {
		bad("EndTs %v is not after StartTs %v", d.EndTs, d.StartTs)
	}
	return errors.Join(errs...)
}
