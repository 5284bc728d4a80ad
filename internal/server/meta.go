package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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

// loadOrCreateMeta returns the data directory's workload, creating it from
// cfg (start now, end after Duration) on first use. A directory whose
// workload differs from cfg is refused: replaying another workload would
// make verification meaningless.
func loadOrCreateMeta(cfg Config, nowTs common.Ts) (runMeta, bool, error) {
	m := runMeta{Seed: cfg.Seed, Tables: cfg.Tables, Changefeeds: cfg.Changefeeds, Rate: cfg.Rate, TxnRows: cfg.TxnRows,
		RowBytes: cfg.RowBytes, HotFraction: cfg.HotFraction, DDLEveryMs: cfg.DDLInterval.Milliseconds(), StartTs: nowTs,
		EndTs: common.ComposeTs(nowTs.PhysicalMs()+cfg.Duration.Milliseconds(), 0)}
	if cfg.DataDir == "" || !cfg.DurableSink {
		return m, false, nil
	}
	path := filepath.Join(cfg.DataDir, metaFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return m, false, err
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return m, false, err
		}
		return m, false, os.Rename(tmp, path)
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
