package replicate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pglink"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// ErrSameDatabase: --sink names the source's own database.
var ErrSameDatabase = errors.New("the target is the source's own database")

// ErrTargetUnwritable: the target is a standby, read-only, or the role
// may not create the changefeed's schema there.
var ErrTargetUnwritable = errors.New("the target cannot be written")

// preflight is what a start found before it changed anything.
type preflight struct {
	source, target pglink.Identity
	// reg is this changefeed's row of the source's registry: the one
	// found (registered) or the one to write.
	reg        pgsource.Registration
	registered bool
}

// checkStart runs every check a start can fail on before it creates,
// drops, terminates or writes anything on either database, so that a start
// that fails leaves both as it found them (the flags and the metrics port
// are checked before it, by Run):
//
//   - both databases answer, and the target is not the source's own
//     database (another database of the same cluster is allowed: the
//     tool's schema is never replicated);
//   - the source: a primary, wal_level logical, a role that may replicate,
//     create the publication if it is missing and read its tables, a slot
//     of this database the server has not invalidated, if there is one, and
//     room for another slot and WAL sender (pgsource.CheckOn), and CREATE on
//     the database for the registry;
//   - the target: a primary, not read-only, CREATE on the database (the
//     cdcflow schema), and no other changefeed's schema (another owner, or
//     this slot's owner bound to another source);
//   - the binding: the slot is registered for this target, or it is
//     missing (it will be created, registered first), or it predates the
//     registry and this target holds its positions (adopted). A slot
//     registered for another target, or found unregistered, is refused
//     naming its owner: it is never taken over nor dropped.
func checkStart(ctx context.Context, cfg Config) (*preflight, error) {
	src, err := pgsource.Connect(ctx, cfg.Source)
	if err != nil {
		return nil, fmt.Errorf("the source: %s: %w", pglink.Cause(err), err)
	}
	defer src.Close(context.Background())
	dst, err := pgsink.Connect(ctx, cfg.Sink)
	if err != nil {
		return nil, fmt.Errorf("%w: the target: %s", pgsink.ErrConnect, pglink.Cause(err))
	}
	defer dst.Close(context.Background())
	pf := &preflight{}
	if pf.source, err = pglink.Identify(ctx, src); err != nil {
		return nil, fmt.Errorf("the source: %w", err)
	}
	if pf.target, err = pglink.Identify(ctx, dst); err != nil {
		return nil, fmt.Errorf("the target: %w", err)
	}
	if pf.source.Same(pf.target) {
		return nil, fmt.Errorf("%w: --source and --sink both reach %s: a changefeed would copy every row onto itself and then "+
			"replicate its own writes for ever; point --sink at another database (of this cluster or another)", ErrSameDatabase, pf.source)
	}
	if err := pgsource.CheckOn(ctx, src, cfg.Publication, cfg.Slot); err != nil {
		return nil, err
	}
	if err := checkRegistryRoom(ctx, src); err != nil {
		return nil, err
	}
	if err := checkTarget(ctx, dst, cfg.Slot, pf.source); err != nil {
		return nil, err
	}
	if err := pf.bind(ctx, cfg, src, dst); err != nil {
		return nil, err
	}
	return pf, nil
}

// checkRegistryRoom checks that the source's role may write the registry.
func checkRegistryRoom(ctx context.Context, src *pgx.Conn) error {
	var ok bool
	var role string
	// CREATE on the database even where the schema exists: the registry's
	// CREATE SCHEMA IF NOT EXISTS needs it all the same.
	if err := src.QueryRow(ctx, `SELECT current_user, has_database_privilege(current_database(), 'CREATE')
  AND (to_regclass('cdcflow.changefeeds') IS NULL OR has_table_privilege('cdcflow.changefeeds', 'SELECT, INSERT, UPDATE, DELETE'))`).Scan(&role, &ok); err != nil {
		return fmt.Errorf("%w: %w", pgsource.ErrConnect, err)
	}
	if !ok {
		return fmt.Errorf("%w: role %q may not create the changefeed registry on the source (schema cdcflow): "+
			"GRANT CREATE ON DATABASE to it, or create the schema for it", pgsource.ErrPrivilege, role)
	}
	return nil
}

// checkTarget checks that the target can be written and holds no other
// changefeed.
func checkTarget(ctx context.Context, dst *pgx.Conn, slot string, source pglink.Identity) error {
	var recovery, readOnly, room bool
	var role string
	// CREATE on the database even where the schema exists: the sink's
	// CREATE SCHEMA IF NOT EXISTS needs it all the same.
	if err := dst.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')::bool, current_user,
  has_database_privilege(current_database(), 'CREATE')
    AND (to_regnamespace('cdcflow') IS NULL OR has_schema_privilege('cdcflow', 'CREATE, USAGE'))`).Scan(&recovery, &readOnly, &role, &room); err != nil {
		return fmt.Errorf("%w: the target: %w", pgsink.ErrConnect, err)
	}
	switch {
	case recovery:
		return fmt.Errorf("%w: it is a standby (in recovery): point --sink at a primary", ErrTargetUnwritable)
	case readOnly:
		return fmt.Errorf("%w: its transactions are read-only for role %q (default_transaction_read_only)", ErrTargetUnwritable, role)
	case !room:
		return fmt.Errorf("%w: role %q may not create the changefeed's schema (cdcflow) there: GRANT CREATE ON DATABASE to it", ErrTargetUnwritable, role)
	}
	owners, err := pgsink.ReadOwners(ctx, dst)
	if err != nil {
		return fmt.Errorf("%w: the target's changefeeds: %w", pgsink.ErrConnect, err)
	}
	for _, o := range owners {
		switch {
		case o.Name != slot:
			return fmt.Errorf("%w: the target holds changefeed %q (one changefeed per target database; its slot is %q): "+
				"use --slot %s to resume it, or remove it first (cdcserver remove)", pgsink.ErrAnotherOwner, o.Name, o.Name, o.Name)
		case o.Source != "" && o.Source != source.Key():
			return fmt.Errorf("%w: changefeed %q of this target replicates source %s, not %s: remove it first (cdcserver remove), "+
				"or use another target", pgsink.ErrOtherSource, o.Name, o.Source, source)
		}
	}
	return nil
}

// bind decides whose the slot is (see checkStart).
func (pf *preflight) bind(ctx context.Context, cfg Config, src, dst *pgx.Conn) error {
	reg, found, err := pgsource.LoadRegistration(ctx, src, cfg.Slot)
	if err != nil {
		return err
	}
	if found {
		if !reg.CreatedPublication && (len(cfg.Include) > 0 || len(cfg.Exclude) > 0) {
			return fmt.Errorf("%w: --include and --exclude choose the tables of a publication serve creates; this changefeed's "+
				"publication %s is not one (ALTER PUBLICATION to change its tables)", ErrInvalidConfig, reg.Publication)
		}
		if !reg.TargetID.Same(pf.target) {
			return fmt.Errorf("%w: slot %s of this source is the changefeed into %s (registered %s), not into %s: "+
				"it is left alone; choose another --slot for this target, or remove that changefeed first (cdcserver remove)",
				pgsource.ErrNotOwner, cfg.Slot, reg.Target, reg.RegisteredAt.Format(time.RFC3339), pf.target)
		}
		pf.reg, pf.registered = reg, true
		return nil
	}
	var slotExists, pubExists bool
	if err := src.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
  EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)`, cfg.Slot, cfg.Publication).Scan(&slotExists, &pubExists); err != nil {
		return fmt.Errorf("%w: %w", pgsource.ErrConnect, err)
	}
	pf.reg = pgsource.Registration{Slot: cfg.Slot, TargetID: pf.target, Target: fmt.Sprintf("%s/%s", pf.target.Address, pf.target.Database),
		Publication: cfg.Publication, CreatedPublication: !pubExists, Tables: cfg.tableRule()}
	if pubExists && (len(cfg.Include) > 0 || len(cfg.Exclude) > 0) {
		return fmt.Errorf("%w: --include and --exclude choose the tables of a publication serve creates; publication %s exists and is "+
			"read as it is (ALTER PUBLICATION to change its tables)", ErrInvalidConfig, cfg.Publication)
	}
	if !slotExists {
		return nil
	}
	// A slot of a version before the registry: this target's if it holds
	// positions saved for it (every start saves one before it streams).
	var ours bool
	if err := dst.QueryRow(ctx, "SELECT to_regclass('cdcflow.source_positions') IS NOT NULL").Scan(&ours); err != nil {
		return fmt.Errorf("%w: the target's positions: %w", pgsink.ErrConnect, err)
	}
	if ours { // two statements: a query naming a table that does not exist fails at parse
		if err := dst.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM cdcflow.source_positions WHERE slot = $1)", cfg.Slot).Scan(&ours); err != nil {
			return fmt.Errorf("%w: the target's positions: %w", pgsink.ErrConnect, err)
		}
	}
	if !ours {
		return fmt.Errorf("%w: slot %s exists on the source, but no changefeed registered it and this target holds no position of it "+
			"(another changefeed's, another tool's, or made by hand): it is left alone; choose another --slot, or drop it if nothing uses it "+
			"(SELECT pg_drop_replication_slot('%s'))", pgsource.ErrNotOwner, cfg.Slot, cfg.Slot)
	}
	return nil
}

// register writes this changefeed's row of the registry unless it was
// there, before anything else is created: two starts racing for one slot
// name find one winner, and the other is refused.
func (pf *preflight) register(ctx context.Context, cfg Config) error {
	src, err := pgsource.Connect(ctx, cfg.Source)
	if err != nil {
		return err
	}
	defer src.Close(context.Background())
	if pf.registered {
		if pf.reg.CreatedPublication { // this start's rule, for the poll and status
			return pgsource.SetTableRule(ctx, src, cfg.Slot, cfg.tableRule())
		}
		return nil
	}
	got, err := pgsource.Register(ctx, src, pf.reg)
	if err != nil {
		return err
	}
	if !got.TargetID.Same(pf.target) {
		return fmt.Errorf("%w: slot %s was registered meanwhile by the changefeed into %s", pgsource.ErrNotOwner, cfg.Slot, got.Target)
	}
	pf.reg, pf.registered = got, true
	return nil
}
