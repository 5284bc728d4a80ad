// The summary: a run's verdict (Summary, decideVerdict), cdcserver's exit
// status for it (ExitStatus) and how it is printed (writeSummary).

package synthetic

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
)

// Quantiles is a p50/p99/max triple.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Summary is the run's verdict; with --json it is printed as one object.
type Summary struct {
	// Verdict is VerdictVerified, VerdictNotDrained or VerdictFailed
	// (decideVerdict); Verified is Verdict == VerdictVerified.
	Verdict     string `json:"verdict"`
	Verified    bool   `json:"verified"`
	Interrupted bool   `json:"interrupted"`
	Complete    bool   `json:"complete"`
	// Drained is whether every dispatcher had reached its final target
	// (the upstream's final resolved-ts, or after an interruption what the
	// store had committed) by the drain deadline: only then are the gaps
	// of a dispatcher loss. BehindDispatchers counts those that had not;
	// above each one's checkpoint, the upstream rows and DDLs its sink does
	// not hold are UndeliveredRows and UndeliveredDDLs (late, not lost),
	// and SlowestLagMs is how far the slowest one's checkpoint was behind
	// its final target at the deadline (commit-ts time, not wall time),
	// SlowestDispatcher who it was. Complete is the same fact as Drained,
	// kept under its earlier name.
	Drained           bool    `json:"drained"`
	BehindDispatchers int     `json:"behind_dispatchers"`
	UndeliveredRows   int64   `json:"undelivered_rows"`
	UndeliveredDDLs   int     `json:"undelivered_ddls"`
	SlowestLagMs      float64 `json:"slowest_lag_ms"`
	SlowestDispatcher string  `json:"slowest_dispatcher,omitempty"`
	Dispatchers       int     `json:"dispatchers"`
	Tables            int     `json:"tables"`
	Changefeeds       int     `json:"changefeeds"`
	RowsUpstream      int64   `json:"rows_upstream"`
	RowsDelivered     int64   `json:"rows_delivered"`
	RowsApplied       uint64  `json:"rows_applied"`
	RowsPerSec        float64 `json:"rows_per_sec"`
	DDLsUpstream      int     `json:"ddls_upstream"`
	DDLsDelivered     int     `json:"ddls_delivered"`
	Resets            uint64  `json:"resets"`
	Moves             int64   `json:"moves"`
	LostWakeups       int     `json:"lost_wakeups"`
	OrderViolations   int     `json:"order_violations"`
	Duplicates        int     `json:"duplicates"`
	MissingRows       int     `json:"missing_rows"`
	UnexpectedRows    int     `json:"unexpected_rows"`
	DDLMismatches     int     `json:"ddl_mismatches"`
	// SinkErrors counts dispatchers whose sink could not be read: nothing
	// about them is proven, and the run fails.
	SinkErrors    int       `json:"sink_errors"`
	NotifyNs      Quantiles `json:"notify_ns"`
	ResolvedLagMs Quantiles `json:"resolved_lag_ms"`
	// WarmupSec is how long, after the upstream started, the dispatchers
	// took to catch up with the rows produced while they were registered;
	// ResolvedLagMs is sampled after it. Warm is false when some
	// dispatcher was still catching up when the upstream ended: then no
	// lag was sampled (the system did not keep up at all).
	WarmupSec float64 `json:"warmup_sec"`
	Warm      bool    `json:"warm"`
	// WallSec is the whole run, registration and verification included;
	// PeakRSSMB the process's peak resident set (getrusage), so a scale
	// figure carries its memory; Flags the command line.
	WallSec   float64 `json:"wall_sec"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
	Flags     string  `json:"flags"`
	// THP is the host's transparent-huge-page mode (Linux's
	// /sys/kernel/mm/transparent_hugepage/enabled: always, madvise or
	// never; empty where unknown). The Go runtime asks for no huge pages,
	// so only "always" backs the heap with them, which at a million
	// dispatchers lowers the CPU of an advance (docs/benchmarks.md, "Scale
	// runs").
	THP              string  `json:"thp,omitempty"`
	PeakPendingTasks int     `json:"peak_pending_tasks"`
	PeakPendingPrep  int     `json:"peak_pending_prepare"`
	PeakPendingScan  int     `json:"peak_pending_scan"`
	CoalescedRatio   float64 `json:"coalesced_ratio"`
	Notifications    uint64  `json:"notifications"`
	FaultsInjected   uint64  `json:"faults_injected"`
	ElapsedSec       float64 `json:"elapsed_sec"`
	MetricsAddr      string  `json:"metrics_addr,omitempty"`
	// Role is the process's --role; with collectors in other processes,
	// CollectorRestarts counts the collector processes started again after
	// they exited on their own, Reconnects their data streams opened
	// again, and Reregistered the dispatchers they registered again (from
	// their checkpoints, under new registrations) after those reconnects.
	Role              string   `json:"role"`
	CollectorRestarts int      `json:"collector_restarts"`
	Reconnects        int64    `json:"reconnects"`
	Reregistered      int64    `json:"reregistered"`
	Problems          []string `json:"problems,omitempty"`
}

const maxProblems = 20

// Verdicts (Summary.Verdict).
const (
	// VerdictVerified: drained, and the sinks hold exactly the upstream's
	// rows and DDLs, in order, without duplicates.
	VerdictVerified = "verified"
	// VerdictNotDrained: some dispatcher was behind at the drain deadline
	// (delivery slower than the offered load, or stuck: a run cannot tell
	// which), and nothing the sinks hold proves a violation.
	VerdictNotDrained = "not_drained"
	// VerdictFailed: a violation proven from what the sinks hold, drained
	// or not: a row or DDL out of order, twice, not the upstream's, or
	// missing at or below the checkpoint its sink confirmed; a drained
	// dispatcher whose sink lacks the final checkpoint (a lost wakeup); a
	// sink that cannot be read.
	VerdictFailed = "failed"
)

// violations counts what proves delivery wrong, drained or not.
func (s *Summary) violations() int {
	return s.LostWakeups + s.OrderViolations + s.Duplicates + s.MissingRows + s.UnexpectedRows + s.DDLMismatches + s.SinkErrors
}

// decideVerdict is a run's verdict. A proven violation fails the run
// whether it drained or not (a late run can still prove a loss); without
// one, a run is verified only if it drained: before that, a gap may be
// delivery that had not happened yet.
func decideVerdict(drained bool, violations int) string {
	switch {
	case violations > 0:
		return VerdictFailed
	case !drained:
		return VerdictNotDrained
	default:
		return VerdictVerified
	}
}

// ExitStatus is cdcserver's exit status for a run that produced s: one
// per verdict (exitcode.OK, NotDrained, Failed).
func ExitStatus(s Summary) int {
	switch decideVerdict(s.Drained, s.violations()) {
	case VerdictVerified:
		return exitcode.OK
	case VerdictNotDrained:
		return exitcode.NotDrained
	default:
		return exitcode.Failed
	}
}

func (s *Summary) problem(format string, args ...any) {
	if len(s.Problems) < maxProblems {
		s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
	}
}

// writeSummary prints the summary: one JSON object, or text.
func writeSummary(w io.Writer, asJSON bool, s Summary) error {
	if asJSON {
		enc := json.NewEncoder(w)
		return enc.Encode(s)
	}
	verdict := verdictLine(s)
	warmup := fmt.Sprintf("after a %.1fs warm-up", s.WarmupSec)
	if !s.Warm {
		warmup = "not sampled: the dispatchers never caught up with the registration period"
	}
	_, err := fmt.Fprintf(w, `%s
  dispatchers        %d (%d tables x %d changefeeds)
  rows               upstream %d, delivered %d (applied %d incl. re-deliveries), %.0f rows/s over %.1fs
  DDLs               upstream %d, delivered %d
  resets             %d   faults injected %d   moves %d
  lost wakeups       %d   order violations %d   duplicates %d   missing %d   unexpected %d   DDL mismatches %d
  notify callback    p50 %.0f ns   p99 %.0f ns   max %.0f ns   (%d notifications, %.1f%% coalesced)
  resolved-ts lag    p50 %.1f ms   p99 %.1f ms   max %.1f ms   (%s)
  peak pending tasks %d (prepare %d, scan %d)
  wall               %.1fs (registration and verification included), peak RSS %.0f MB
`, verdict, s.Dispatchers, s.Tables, s.Changefeeds, s.RowsUpstream, s.RowsDelivered, s.RowsApplied, s.RowsPerSec, s.ElapsedSec,
		s.DDLsUpstream, s.DDLsDelivered, s.Resets, s.FaultsInjected, s.Moves, s.LostWakeups, s.OrderViolations, s.Duplicates,
		s.MissingRows, s.UnexpectedRows, s.DDLMismatches, s.NotifyNs.P50, s.NotifyNs.P99, s.NotifyNs.Max, s.Notifications,
		100*s.CoalescedRatio, s.ResolvedLagMs.P50, s.ResolvedLagMs.P99, s.ResolvedLagMs.Max, warmup, s.PeakPendingTasks,
		s.PeakPendingPrep, s.PeakPendingScan, s.WallSec, s.PeakRSSMB)
	if err != nil {
		return err
	}
	if !s.Drained {
		if _, err := fmt.Fprintf(w, "  not drained        %d dispatchers behind at the drain deadline; undelivered %d rows, %d DDLs; slowest lag %.1f ms: %s\n",
			s.BehindDispatchers, s.UndeliveredRows, s.UndeliveredDDLs, s.SlowestLagMs, s.SlowestDispatcher); err != nil {
			return err
		}
	}
	for _, p := range s.Problems {
		if _, err := fmt.Fprintf(w, "  problem: %s\n", p); err != nil {
			return err
		}
	}
	return nil
}

// verdictLine is the summary's first line. A run that did not drain says
// so with its extent, whether or not it also failed: "lost wakeup" and
// "missing" are only what a run proves lost, never what was merely late.
func verdictLine(s Summary) string {
	notDrained := fmt.Sprintf("NOT DRAINED: %d of %d dispatchers behind the upstream's final resolved-ts at the drain deadline, %d rows undelivered, slowest lag %.1f ms",
		s.BehindDispatchers, s.Dispatchers, s.UndeliveredRows, s.SlowestLagMs)
	switch decideVerdict(s.Drained, s.violations()) {
	case VerdictVerified:
		return "VERIFIED"
	case VerdictNotDrained:
		return notDrained + "; nothing delivered contradicts the upstream"
	}
	if !s.Drained {
		return "VERIFICATION FAILED (and " + notDrained + ")"
	}
	return "VERIFICATION FAILED"
}
