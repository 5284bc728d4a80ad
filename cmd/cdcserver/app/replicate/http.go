package replicate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// httpServers are serve's endpoints: /metrics, /healthz and /readyz on
// the metrics address, /debug/pprof on its own loopback address. Their
// ports are bound before a start changes anything (listenHTTP: a port
// taken is a failed start that left both databases alone) and served once
// the parts are built (serve).
type httpServers struct {
	listeners []net.Listener // nil where the address is empty
	servers   []*http.Server
	addrs     []string
	wg        sync.WaitGroup
}

// listenHTTP binds the metrics and the pprof addresses.
func listenHTTP(cfg Config) (*httpServers, error) {
	h := &httpServers{}
	for _, addr := range []string{cfg.MetricsAddr, cfg.PprofAddr} {
		if addr == "" {
			h.listeners, h.addrs = append(h.listeners, nil), append(h.addrs, "")
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			h.close(time.Time{})
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		h.listeners, h.addrs = append(h.listeners, ln), append(h.addrs, ln.Addr().String())
	}
	return h, nil
}

// serve serves p's endpoints on the bound listeners.
func (h *httpServers) serve(cfg Config, p *parts) {
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{}))
	metrics.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	metrics.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := p.notReady(cfg.ReadyLag); len(why) > 0 {
			http.Error(w, "not ready: "+strings.Join(why, "; "), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	prof := PprofMux()
	for i, mux := range []*http.ServeMux{metrics, prof} {
		ln := h.listeners[i]
		if ln == nil {
			continue
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		h.servers = append(h.servers, srv)
		h.wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				p.log.Warn("http", zap.Error(err))
			}
		})
	}
}

func (h *httpServers) metricsAddr() string { return h.addrs[0] }
func (h *httpServers) pprofAddr() string {
	if len(h.addrs) < 2 {
		return ""
	}
	return h.addrs[1]
}

// close shuts the servers down, giving requests in flight 2 s, or what
// is left until by (a clean stop's end; zero: none).
func (h *httpServers) close(by time.Time) {
	wait := 2 * time.Second
	if !by.IsZero() {
		wait = min(wait, max(0, time.Until(by)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, s := range h.servers {
		_ = s.Shutdown(ctx)
	}
	if len(h.servers) == 0 { // never served: the listeners are still only bound
		for _, ln := range h.listeners {
			if ln != nil {
				_ = ln.Close()
			}
		}
	}
	h.wg.Wait()
}

// PprofMux serves /debug/pprof (serve's --pprof-addr, a node's).
func PprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
