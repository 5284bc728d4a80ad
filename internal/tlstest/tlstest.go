package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority of a test.
type CA struct {
	// File is the CA certificate's PEM file.
	File string
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	next atomic.Int64
}

// Files are a leaf certificate's files: CA is its authority's.
type Files struct{ CA, Cert, Key string }

// NewCA makes a CA named name and writes its certificate in dir.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(t, err)
	cert, err := x509.ParseCertificate(der)
	check(t, err)
	ca := &CA{File: filepath.Join(dir, name+"-ca.pem"), dir: dir, cert: cert, key: key}
	ca.next.Store(1)
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue signs a certificate for 127.0.0.1, usable by either side (server
// and client usages), with DNS names dnsNames as its identities, and
// writes it and its key in the CA's directory as name.pem and name-key.pem.
func (ca *CA) Issue(t testing.TB, name string, dnsNames ...string) Files {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.next.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: dnsNames, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	check(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	check(t, err)
	f := Files{CA: ca.File, Cert: filepath.Join(ca.dir, name+".pem"), Key: filepath.Join(ca.dir, name+"-key.pem")}
	writePEM(t, f.Cert, "CERTIFICATE", der)
	writePEM(t, f.Key, "EC PRIVATE KEY", keyDER)
	return f
}

// ServerConfig is a TLS 1.3 server configuration of f that requires a
// client certificate signed by f's CA.
func ServerConfig(t testing.TB, f Files) *tls.Config {
	t.Helper()
	cert, pool := load(t, f)
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS13}
}

// ClientConfig is a TLS 1.3 client configuration of f that trusts f's CA
// for 127.0.0.1.
func ClientConfig(t testing.TB, f Files) *tls.Config {
	t.Helper()
	cert, pool := load(t, f)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
}

func load(t testing.TB, f Files) (tls.Certificate, *x509.CertPool) {
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	check(t, err)
	b, err := os.ReadFile(f.CA)
	check(t, err)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("tlstest: %s holds no certificate", f.CA)
	}
	return cert, pool
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	check(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("tlstest: %v", err)
	}
}
