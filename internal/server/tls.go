package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
)

// loadTLS reads the certificate, key and CA of cfg; nil when TLS is off.
func loadTLS(cfg Config) (*tls.Certificate, *x509.CertPool, error) {
	if cfg.TLSCert == "" {
		return nil, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --tls-cert/--tls-key: %w", ErrInvalidConfig, err)
	}
	pem, err := os.ReadFile(cfg.TLSCA)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --tls-ca: %w", ErrInvalidConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("%w: --tls-ca %s holds no PEM certificate", ErrInvalidConfig, cfg.TLSCA)
	}
	return &cert, pool, nil
}

// serverTLS is the service's side of mutual TLS: its certificate, and
// collectors must present one signed by the CA. nil when TLS is off.
func serverTLS(cfg Config) (*tls.Config, error) {
	cert, pool, err := loadTLS(cfg)
	if cert == nil || err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{*cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

// clientTLS is a collector's side: its certificate, and the service's
// must be signed by the CA for the host it connects to. nil when TLS is
// off.
func clientTLS(cfg Config) (*tls.Config, error) {
	cert, pool, err := loadTLS(cfg)
	if cert == nil || err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(cfg.Connect)
	if err != nil {
		return nil, fmt.Errorf("%w: --connect=%q: %w", ErrInvalidConfig, cfg.Connect, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{*cert}, RootCAs: pool, ServerName: host,
		MinVersion: tls.VersionTLS13}, nil
}
