package pgsource

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdcflow/eventservice/internal/pgdial"
	"github.com/cdcflow/eventservice/pkg/common"
)

// TablePositions is a PositionStore in a table of a PostgreSQL database,
// cdcflow.source_positions: typically the sink's, so that the slot's
// positions live and die with the checkpoints they match. It keeps the
// last positionsKept of each slot: the slot's confirmed flush LSN is the
// last one saved, or, if the confirmation did not reach the server, one
// of the few before.
type TablePositions struct {
	pool *pgxpool.Pool
}

const positionsKept = 16

// NewTablePositions connects to dsn and creates the table if missing.
// Close releases the connections.
func NewTablePositions(ctx context.Context, dsn string) (*TablePositions, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: positions: %w", ErrConnect, err)
	}
	pgdial.Apply(&cfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: positions: %w", ErrConnect, err)
	}
	_, err = pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS cdcflow;
CREATE TABLE IF NOT EXISTS cdcflow.source_positions (
  slot text NOT NULL, lsn bigint NOT NULL, ts bigint NOT NULL, saved_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (slot, lsn))`)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: positions: %w", ErrConnect, err)
	}
	return &TablePositions{pool: pool}, nil
}

// Close releases the connections.
func (p *TablePositions) Close() { p.pool.Close() }

// Save implements PositionStore.
func (p *TablePositions) Save(ctx context.Context, slot string, pos Position) error {
	_, err := p.pool.Exec(ctx, `
INSERT INTO cdcflow.source_positions (slot, lsn, ts) VALUES ($1, $2, $3)
ON CONFLICT (slot, lsn) DO UPDATE SET ts = EXCLUDED.ts, saved_at = now()`, slot, int64(pos.LSN), int64(pos.Ts))
	if err != nil {
		return err
	}
	_, err = p.pool.Exec(ctx, `
DELETE FROM cdcflow.source_positions WHERE slot = $1 AND lsn < (
  SELECT min(lsn) FROM (SELECT lsn FROM cdcflow.source_positions WHERE slot = $1 ORDER BY lsn DESC LIMIT $2) AS kept)`,
		slot, positionsKept)
	return err
}

// Load implements PositionStore.
func (p *TablePositions) Load(ctx context.Context, slot string, lsn uint64) (Position, bool, error) {
	var ts int64
	err := p.pool.QueryRow(ctx, "SELECT ts FROM cdcflow.source_positions WHERE slot = $1 AND lsn = $2", slot, int64(lsn)).Scan(&ts)
	if errors.Is(err, pgx.ErrNoRows) {
		return Position{}, false, nil
	}
	if err != nil {
		return Position{}, false, err
	}
	if ts < 0 {
		// Not as Save writes it: as a Ts it would be past every commit.
		return Position{}, false, fmt.Errorf("%w: cdcflow.source_positions: slot %s at %d has ts %d", ErrCorruptPosition, slot, lsn, ts)
	}
	return Position{LSN: lsn, Ts: common.Ts(ts)}, true, nil
}

// Forget deletes the slot's positions (a slot dropped to start over).
func (p *TablePositions) Forget(ctx context.Context, slot string) error {
	_, err := p.pool.Exec(ctx, "DELETE FROM cdcflow.source_positions WHERE slot = $1", slot)
	return err
}
