// Package tlstest makes certificate authorities and certificates for tests
// of mutual TLS: a CA, and leaf certificates it signs for 127.0.0.1 with
// the subject alternative names a test chooses (the identities a
// remote.Policy grants targets to). Files are PEM, written in a directory
// of the test's.
//
// Invariants: every CA and certificate gets a fresh ECDSA P-256 key and is
// valid from an hour ago until a day from now; a CA's serial numbers are
// unique (Issue may run from parallel tests, under distinct names); files
// are written 0600 in the CA's directory only; any failure ends the test
// (t.Fatalf), none is returned; nothing is package-level state.
package tlstest
