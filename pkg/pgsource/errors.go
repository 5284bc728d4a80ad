package pgsource

import "errors"

// Sentinel errors (errors.Is).
var (
	// ErrMalformedMessage wraps every decoding error of a pgoutput message.
	ErrMalformedMessage = errors.New("pgsource: malformed pgoutput message")
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("pgsource: invalid options")
	// ErrConnect: the source database cannot be reached (a bad DSN, the
	// server down, authentication).
	ErrConnect = errors.New("pgsource: cannot connect to the source")
	// ErrNotLogical: the source's wal_level is not logical.
	ErrNotLogical = errors.New("pgsource: the source's wal_level is not logical")
	// ErrUnreplicable: a published table's description is one a sink
	// cannot turn into SQL (a name with a NUL, a type name that is not
	// one); it is left out. A table without a key is replicated
	// (pgcodec.Relation.Identity).
	ErrUnreplicable = errors.New("pgsource: a table that cannot be replicated")
	// ErrKeylessTooLarge: a table without a key that joined while
	// streaming holds more than Options.KeylessCopyBytes of values, which
	// CopyTable would hold at once (copy_keyless.go). Add a primary key,
	// or raise the bound.
	ErrKeylessTooLarge = errors.New("pgsource: a table without a key is too large to copy while streaming")
	// ErrUnknownSlot: the slot exists but no position was saved for its
	// confirmed flush LSN: its commit-ts cannot be recovered. Drop the
	// slot (or point at the positions store it was made with).
	ErrUnknownSlot = errors.New("pgsource: the slot's position is unknown")
	// ErrSlotInUse: the slot is attached to a walsender (another process
	// streams it, or one that died and the server has not noticed yet) and
	// Options.TakeOver is off: its confirmed flush LSN may still move, so
	// it is no place to resume from.
	ErrSlotInUse = errors.New("pgsource: the slot is in use")
	// ErrStartTsTruncated: a subscription asks for changes the slot no
	// longer holds (below its confirmed flush).
	ErrStartTsTruncated = errors.New("pgsource: start-ts below what the slot retains")
	// ErrUnsupportedSpan: a subscription of part of a table.
	ErrUnsupportedSpan = errors.New("pgsource: only whole-table spans are supported")
	// ErrClosed: the source is closed.
	ErrClosed = errors.New("pgsource: closed")
	// ErrProtocol: the server sent what pgoutput never sends (a tuple
	// whose columns do not match its relation, a change outside a
	// transaction).
	ErrProtocol = errors.New("pgsource: protocol violation")
	// ErrSlotTakenOver: another process of the changefeed confirmed the
	// slot past what this source's tables have (a later process took the
	// changefeed over); the source stops.
	ErrSlotTakenOver = errors.New("pgsource: another process took the slot over")
	// ErrForeignSlot: the slot's name is taken by a slot this source
	// cannot use: another database's (slot names are the server's, not a
	// database's), a physical one, or one of another output plugin. It is
	// neither used, taken over nor dropped.
	ErrForeignSlot = errors.New("pgsource: the slot belongs to something else")
	// ErrTableGone: a table to copy no longer exists.
	ErrTableGone = errors.New("pgsource: the table is gone")
	// ErrSourceSilent ends a replication session that heard nothing from
	// the server for ReceiveTimeout, a reply asked for half-way included;
	// the source connects again.
	ErrSourceSilent = errors.New("pgsource: the source sent nothing within the receive timeout")
	// ErrPrivilege: the source's role lacks a privilege the changefeed needs
	// (REPLICATION, CREATE on the database, or what creating the publication
	// takes).
	ErrPrivilege = errors.New("pgsource: the source role lacks a privilege")
	// ErrNotPrimary: the source is a standby (in recovery): PostgreSQL 15
	// decodes logical replication on a primary only.
	ErrNotPrimary = errors.New("pgsource: the source is a standby")
	// ErrNoRoom: the source has no free replication slot or WAL sender.
	ErrNoRoom = errors.New("pgsource: no room on the source")
	// ErrCorruptPosition: a saved position holds what TablePositions never
	// writes (a negative commit-ts), so the slot cannot be resumed from it.
	ErrCorruptPosition = errors.New("pgsource: a saved source position is corrupt")
	// ErrBadPattern: a table pattern that is no glob.
	ErrBadPattern = errors.New("pgsource: bad table pattern")
	// ErrNotOwner: the slot belongs to another changefeed (registered for
	// another target), or exists without having been registered.
	ErrNotOwner = errors.New("pgsource: the slot is not this changefeed's")
	// ErrCorruptRegistry: the registry holds a row that does not read (a
	// target identity that is not one).
	ErrCorruptRegistry = errors.New("pgsource: corrupt changefeed registry")
	// ErrSlotLost: the server invalidated the slot (wal_status lost): it
	// retained more WAL than max_slot_wal_keep_size allows, and the WAL the
	// changefeed needs is gone. It cannot resume; starting over means a new
	// slot and a new snapshot.
	ErrSlotLost = errors.New("pgsource: the slot was invalidated by the server (wal_status lost)")
	// ErrSlotDropped: the slot was dropped while the changefeed ran (an
	// operator, cdcserver remove): the changes since its last confirmed
	// position are gone, and streaming cannot go on.
	ErrSlotDropped = errors.New("pgsource: the slot was dropped")
)
