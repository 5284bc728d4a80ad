// Package pgcodec is the format in which PostgreSQL changes travel from the
// logical replication source (pkg/pgsource) through the event store and
// the event service to the PostgreSQL sink (pkg/pgsink): a row change as a
// common.Row, and a relation (a table's identity and columns) as the text
// of a DDL.
//
// A change's common.Row:
//   - Key: the change's index within its transaction (4 bytes, big
//     endian), then the replica-identity key's values. The store orders a
//     transaction's rows by key, so its changes keep their WAL order, and
//     two changes of one row in one transaction stay two rows.
//   - Value: the change (insert, update, delete, truncate, move) and its
//     columns by name, each null, unchanged (a TOASTed value the update
//     did not touch: the sink must keep the old one) or text. A delete
//     carries the key columns of the old row; a move (an update that
//     changed the key and left a value unchanged) the new row, then the
//     old key's columns, where the unchanged value is.
//   - Op: OpPut for inserts, updates and moves, OpDelete for deletes and
//     truncates.
//
// A relation's DDL text is "cdcflow/relation/v1 " and a JSON object:
// schema, name, and the columns with their SQL type (format_type), whether
// they are part of the key, the built-in type a created type's column may
// be stored as, and the value a column added with a constant default has
// in the rows that were there.
//
// Invariants: decoding trusts nothing (every length is checked against the
// bytes left before anything is allocated; names are valid UTF-8 without
// NUL); what Encode writes Decode reads back exactly (FuzzDecodeRow).
package pgcodec
