package node

import (
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
)

// The API's protection. With --api-token-file every /api/ call must carry
// "Authorization: Bearer <the file's token>" (401 otherwise; /healthz,
// /readyz and /metrics stay open, for probes and Prometheus); with
// --api-tls-cert and --api-tls-key the node serves HTTPS, and with
// --api-tls-ca it also requires a client certificate that CA signed. Every
// peer is bounded: a request's header must arrive within 10 s and its body
// within 30 s (a TLS handshake within the header's bound), a header is at
// most 64 KiB and a body 1 MiB, and one address holds at most
// maxConnsPerIP connections (one more is closed on accept), so that slow
// or idle peers cannot pin the node's memory or keep others out.

// maxConnsPerIP bounds one address's connections to the API.
const maxConnsPerIP = 32

// errUnauthorized is a call without the API's token.
var errUnauthorized = errors.New("node: the call lacks the API's token (Authorization: Bearer)")

// readToken reads a token file: its first line, trimmed; empty is refused.
func readToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(string(raw), "\n")
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", fmt.Errorf("%s: an empty token", path)
	}
	return tok, nil
}

// requireToken wraps h: /api/ calls need the token (nil token: none).
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cdcserver"`)
			reply(w, http.StatusUnauthorized, map[string]string{"error": errUnauthorized.Error()})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// serverTLS is the API's TLS configuration (nil: plain HTTP).
func serverTLS(cfg Config) (*tls.Config, error) {
	if cfg.APITLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.APITLSCert, cfg.APITLSKey)
	if err != nil {
		return nil, err
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.APITLSCA != "" {
		pool, err := certPool(cfg.APITLSCA)
		if err != nil {
			return nil, err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

func certPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", path)
	}
	return pool, nil
}

// perIPListener closes on accept a connection from an address that holds
// max already.
type perIPListener struct {
	net.Listener
	max int
	mu  sync.Mutex
	n   map[string]int
}

func limitPerIP(l net.Listener, max int) net.Listener {
	return &perIPListener{Listener: l, max: max, n: map[string]int{}}
}

func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		if l.n[host] >= l.max {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.n[host]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.n[host]--; l.n[host] == 0 {
				delete(l.n, host)
			}
		}}, nil
	}
}

// countedConn gives its address's place back once, at Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
