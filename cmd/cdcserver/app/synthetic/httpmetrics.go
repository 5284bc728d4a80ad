package synthetic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// metricsServer serves /metrics and /debug/pprof on a loopback address.
type metricsServer struct {
	ln  net.Listener
	srv *http.Server
	wg  sync.WaitGroup
}

// serveMetricsOf starts serving reg at addr; an empty addr serves nothing
// (the returned server's methods are then no-ops).
func serveMetricsOf(addr string, reg *prometheus.Registry, lg *zap.Logger) (*metricsServer, error) {
	m := &metricsServer{}
	if addr == "" {
		return m, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.ln = ln
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	m.wg.Go(func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			lg.Warn("metrics server", zap.Error(err))
		}
	})
	lg.Info("serving /metrics and /debug/pprof", zap.String("addr", ln.Addr().String()))
	return m, nil
}

// addr is the address served, or "".
func (m *metricsServer) addr() string {
	if m == nil || m.ln == nil {
		return ""
	}
	return m.ln.Addr().String()
}

// close stops serving, waiting up to 2 s for requests in progress.
func (m *metricsServer) close() {
	if m == nil || m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = m.srv.Shutdown(ctx)
	cancel()
	m.wg.Wait()
}
