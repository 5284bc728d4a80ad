// The service's side of collectors in other processes (--role service,
// --remote-collectors): the gRPC server they connect to, the wait for
// their registrations, and their sinks, opened for verification once they
// stopped.

package synthetic

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/pebblesink"
	"github.com/cdcflow/eventservice/pkg/remote"
)

// remoteSide is the service's end of collectors in other processes: the
// gRPC server they connect to and, with --remote-collectors, the collector
// processes it started and supervises.
type remoteSide struct {
	srv      *remote.Server
	ln       net.Listener
	children []*child
	// sinkDirs maps a changefeed (1-based) to the data dir of the collector
	// process that serves it, whose sink the verification reads.
	sinkDirs map[int]string
}

// newRemoteSide builds the gRPC server of the service role.
func (s *server) newRemoteSide() (*remoteSide, error) {
	tlsCfg, err := serverTLS(s.cfg, s.log)
	if err != nil {
		return nil, err
	}
	policy, err := servicePolicy(s.cfg)
	if err != nil {
		return nil, err
	}
	if policy != nil {
		s.log.Info("collectors authorized", zap.String("policy", describePolicy(policy)))
	}
	srv, err := remote.NewServer(remote.ServerOptions{Logger: s.log, TLS: tlsCfg, Policy: policy, Registerer: s.reg,
		AllowInsecureListen: s.cfg.InsecureListen, MaxTargets: s.cfg.MaxTargets,
		// A collector process opens a connection per changefeed it serves.
		MaxConnections:      max(remote.DefaultMaxConnections, 2*s.cfg.Changefeeds),
		MaxConnectionsPerIP: max(remote.DefaultMaxConnectionsPerIP, s.cfg.Changefeeds+8),
		// The service queues at most this much per collector, whatever
		// a collector announces.
		MaxCapacity: s.cfg.InboxCapacity})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &remoteSide{srv: srv, sinkDirs: map[int]string{}}, nil
}

// startRemote serves the gRPC transport and control plane, then starts
// the collector processes, if any. It prints the address and how to start
// a collector by hand.
func (s *server) startRemote(stderr io.Writer) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.rs.ln = ln
	if err := s.rs.srv.Start(ln, s.svc); err != nil {
		_ = ln.Close()
		return err
	}
	addr := ln.Addr().String()
	start := uint64(s.meta.StartTs)
	fmt.Fprintf(stderr, "service: listening on %s; start a collector with: cdcserver %s --role collector --connect %s --start-ts %d --changefeeds %d --tables %d --data-dir DIR [--feeds N,...]\n",
		addr, Command, addr, start, s.cfg.Changefeeds, s.cfg.Tables)
	if s.cfg.RemoteCollectors == 0 {
		return nil // collectors started by hand: their dirs are looked at after they stop
	}
	return s.startCollectorProcesses(addr, start, stderr) // supervisor.go
}

// mapCollectorDirs finds, in --collector-data-dirs, the sink of each
// changefeed not mapped yet.
func (s *server) mapCollectorDirs() {
	if s.cfg.CollectorDataDirs == "" {
		return
	}
	for _, dir := range strings.Split(s.cfg.CollectorDataDirs, ",") {
		for f := 1; f <= s.cfg.Changefeeds; f++ {
			if _, ok := s.rs.sinkDirs[f]; ok {
				continue
			}
			if _, err := os.Stat(sinkDir(dir, f)); err == nil {
				s.rs.sinkDirs[f] = dir
			}
		}
	}
}

// openRemoteSinks opens each changefeed's sink from its collector's data
// dir (read-only use, after the collectors stopped); a feed whose sink
// cannot be opened keeps a nil sink, which verification reports.
func (s *server) openRemoteSinks() {
	s.mapCollectorDirs()
	for i, f := range s.feeds {
		dir, ok := s.rs.sinkDirs[i+1]
		if !ok {
			continue
		}
		sink, err := pebblesink.Open(sinkDir(dir, i+1))
		if err != nil {
			s.log.Warn("open collector sink", zap.Int("feed", i+1), zap.Error(err))
			continue
		}
		for _, d := range f.ds {
			sink.Bind(d.id, d.table)
		}
		f.durable = sink
	}
}

// closeRemoteSinks closes what openRemoteSinks opened.
func (s *server) closeRemoteSinks() {
	for _, f := range s.feeds {
		if f.remote && f.durable != nil {
			_ = f.durable.Close()
			f.durable = nil
		}
	}
}

// awaitRegistrations waits until every dispatcher of every changefeed is
// registered at the service (the collectors register them), bounded by
// DrainTimeout, so that --duration starts with everyone listening, as in
// one process.
func (s *server) awaitRegistrations() error {
	want := s.cfg.Changefeeds * s.cfg.Tables
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	for {
		got := s.svc.Progress().Dispatchers
		if got >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d dispatchers registered within --drain-timeout=%v: are the collectors running?", got, want, s.cfg.DrainTimeout)
		}
		time.Sleep(20 * time.Millisecond) // polling processes we do not own
	}
}
