package synthetic

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
)

// runMeta pins the workload of a data directory, so that a restarted
// server replays exactly the same upstream: the same seed, start and end.
type runMeta struct {
	Seed        uint64    `json:"seed"`
	Tables      int       `json:"tables"`
	Changefeeds int       `json:"changefeeds"`
	Rate        int       `json:"rate"`
	TxnRows     int       `json:"txn_rows"`
	RowBytes    int       `json:"row_bytes"`
	HotFraction float64   `json:"hot_fraction"`
	DDLEveryMs  int64     `json:"ddl_every_ms"`
	StartTs     common.Ts `json:"start_ts"`
	EndTs       common.Ts `json:"end_ts"`
}

const metaFile = "workload.json"

// loadOrCreateMeta returns the data directory's workload, or a fresh one
// from cfg that starts now and whose EndTs is still zero: the run fixes it
// (endAfter) once its dispatchers are registered, so Duration counts live
// time, not registration (a million dispatchers take tens of seconds to
// register). A directory whose workload differs from cfg is refused:
// replaying another workload would make verification meaningless.
func loadOrCreateMeta(cfg Config, nowTs common.Ts) (runMeta, bool, error) {
	m := runMeta{Seed: cfg.Seed, Tables: cfg.Tables, Changefeeds: cfg.Changefeeds, Rate: cfg.Rate, TxnRows: cfg.TxnRows,
		RowBytes: cfg.RowBytes, HotFraction: cfg.HotFraction, DDLEveryMs: cfg.DDLInterval.Milliseconds(), StartTs: nowTs}
	if cfg.DataDir == "" || !cfg.DurableSink {
		return m, false, nil
	}
	path := filepath.Join(cfg.DataDir, metaFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, false, nil // written by endAfter, before the upstream starts
	}
	if err != nil {
		return m, false, err
	}
	var old runMeta
	if err := json.Unmarshal(b, &old); err != nil {
		return m, false, fmt.Errorf("%s: %w", path, err)
	}
	want := m
	want.StartTs, want.EndTs = old.StartTs, old.EndTs
	if old != want {
		return m, false, fmt.Errorf("%w: %s holds another workload (%+v); use a fresh --data-dir", ErrInvalidConfig, path, old)
	}
	return old, true, nil
}

// endAfter fixes a fresh run's EndTs at now + Duration and, with a durable
// sink, writes the meta file, before the upstream starts: a restart then
// replays exactly this workload.
func (m *runMeta) endAfter(cfg Config, now time.Time) error {
	m.EndTs = common.ComposeTs(now.UnixMilli()+cfg.Duration.Milliseconds(), 0)
	if cfg.DataDir == "" || !cfg.DurableSink {
		return nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	path := filepath.Join(cfg.DataDir, metaFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
