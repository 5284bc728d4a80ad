package pglink

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Identity names one database of one PostgreSQL cluster: the cluster's
// system identifier (pg_control_system, the same on every connection to
// it, different for every initdb) and the database's OID, which together
// tell two databases apart however they are reached (host names, ports,
// proxies); Database and Address only describe it to an operator.
type Identity struct {
	SystemID    uint64
	DatabaseOID uint32
	Database    string
	Address     string
}

// Key is the identity as stored and compared: "systemid/dboid".
func (id Identity) Key() string { return fmt.Sprintf("%d/%d", id.SystemID, id.DatabaseOID) }

// Same reports whether a and b are one database.
func (id Identity) Same(o Identity) bool {
	return id.SystemID == o.SystemID && id.DatabaseOID == o.DatabaseOID
}

// SameCluster reports whether a and b are databases of one cluster.
func (id Identity) SameCluster(o Identity) bool { return id.SystemID == o.SystemID }

// String describes the database as an operator reads it.
func (id Identity) String() string {
	return fmt.Sprintf("database %q at %s (system %d, oid %d)", id.Database, id.Address, id.SystemID, id.DatabaseOID)
}

// ParseKey reads a Key back (what a database holds is hostile until read).
func ParseKey(key string) (Identity, bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			sys, err1 := strconv.ParseUint(key[:i], 10, 64)
			oid, err2 := strconv.ParseUint(key[i+1:], 10, 32)
			if err1 != nil || err2 != nil {
				return Identity{}, false
			}
			return Identity{SystemID: sys, DatabaseOID: uint32(oid)}, true
		}
	}
	return Identity{}, false
}

// Identify reads conn's database's identity.
func Identify(ctx context.Context, conn *pgx.Conn) (Identity, error) {
	var id Identity
	var sys string
	err := conn.QueryRow(ctx, `SELECT (SELECT system_identifier::text FROM pg_control_system()), d.oid, d.datname
FROM pg_database d WHERE d.datname = current_database()`).Scan(&sys, &id.DatabaseOID, &id.Database)
	if err != nil {
		return Identity{}, fmt.Errorf("identify the database: %w", err)
	}
	if id.SystemID, err = strconv.ParseUint(sys, 10, 64); err != nil {
		return Identity{}, fmt.Errorf("identify the database: system identifier %q: %w", sys, err)
	}
	cfg := conn.Config()
	id.Address = fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	return id, nil
}
