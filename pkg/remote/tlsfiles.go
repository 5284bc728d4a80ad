package remote

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TLSFiles is mutual TLS from PEM files that are read again whenever they
// change: a certificate (with its key) and the CA that signs the peers'.
// Every handshake reads the three files (a few KiB, once per connection)
// and, if their bytes changed, parses them anew; a rotation therefore
// takes effect at the next connection without a restart. Files that no
// longer parse (caught mid-rotation, say) are logged and the last good
// ones kept. Connections already open keep the certificates they were
// made with.
type TLSFiles struct {
	certFile, keyFile, caFile string
	log                       *zap.Logger

	mu struct {
		sync.Mutex
		raw  [3][]byte // the files' bytes last parsed
		cert *tls.Certificate
		pool *x509.CertPool
	}
}

// NewTLSFiles reads and checks the files once. Errors wrap
// messaging.ErrInvalidOptions. A nil logger is zap.NewNop().
func NewTLSFiles(certFile, keyFile, caFile string, log *zap.Logger) (*TLSFiles, error) {
	if log == nil {
		log = zap.NewNop()
	}
	f := &TLSFiles{certFile: certFile, keyFile: keyFile, caFile: caFile, log: log}
	if _, _, err := f.current(); err != nil {
		return nil, err
	}
	return f, nil
}

// current returns the certificate and CA pool, reloading them if the
// files changed; the last good ones when the new files do not parse.
func (f *TLSFiles) current() (*tls.Certificate, *x509.CertPool, error) {
	var raw [3][]byte
	var errs []error
	for i, name := range []string{f.certFile, f.keyFile, f.caFile} {
		b, err := os.ReadFile(name)
		errs = append(errs, err)
		raw[i] = b
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return f.stale(fmt.Errorf("%w: read TLS files: %w", messaging.ErrInvalidOptions, err))
	}
	if f.mu.cert != nil && bytes.Equal(raw[0], f.mu.raw[0]) && bytes.Equal(raw[1], f.mu.raw[1]) && bytes.Equal(raw[2], f.mu.raw[2]) {
		return f.mu.cert, f.mu.pool, nil
	}
	cert, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return f.stale(fmt.Errorf("%w: %s / %s: %w", messaging.ErrInvalidOptions, f.certFile, f.keyFile, err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[2]) {
		return f.stale(fmt.Errorf("%w: %s holds no PEM certificate", messaging.ErrInvalidOptions, f.caFile))
	}
	if f.mu.cert != nil {
		f.log.Info("TLS certificates reloaded", zap.String("cert", f.certFile), zap.String("ca", f.caFile))
	}
	f.mu.raw, f.mu.cert, f.mu.pool = raw, &cert, pool
	return f.mu.cert, f.mu.pool, nil
}

// stale returns the last good certificates with a warning, or err if
// there are none. REQUIRES: f.mu held.
func (f *TLSFiles) stale(err error) (*tls.Certificate, *x509.CertPool, error) {
	if f.mu.cert == nil {
		return nil, nil, err
	}
	f.log.Warn("TLS files unreadable; keeping the last good ones", zap.Error(err))
	return f.mu.cert, f.mu.pool, nil
}

// ServerConfig is the service's side: TLS 1.3, a client certificate
// signed by the CA required and verified, both as the files say at each
// handshake.
func (f *TLSFiles) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAndVerifyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool, err := f.current()
			if err != nil {
				return nil, err
			}
			return &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAndVerifyClientCert,
				Certificates: []tls.Certificate{*cert}, ClientCAs: pool}, nil
		}}
}

// ClientConfig is a collector's side for a service at serverName (a host
// name or IP): TLS 1.3, its certificate as the files say at each
// handshake, and the service's certificate verified against the CA the
// files hold then. Go's tls.Config takes its roots once, so the chain is
// verified here, in VerifyConnection, with the standard library's
// verifier (InsecureSkipVerify only hands that step to this callback; the
// handshake still proves the service holds its certificate's key).
func (f *TLSFiles) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _, err := f.current()
			return cert, err
		},
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection against the current CA
		VerifyConnection: func(cs tls.ConnectionState) error {
			if serverName == "" {
				// An empty name would skip the host check: any certificate
				// of the CA would pass as the service.
				return errors.New("remote: no service name to verify the certificate against")
			}
			_, pool, err := f.current()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("remote: the service presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: serverName,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		}}
}
