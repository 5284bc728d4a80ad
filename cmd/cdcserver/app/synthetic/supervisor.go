// The supervisor of the collector processes --remote-collectors starts:
// their command lines (this executable's synthetic command with --role
// collector), their restarts on their data dirs when they exit on their
// own, their stop and their summaries (child).

package synthetic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// maxRestarts bounds how often a collector process that exited on its own
// is started again.
const maxRestarts = 10

// child is one collector process, restarted on its data dir if it exits
// before the service asks it to stop (a crash: its durable sinks hold the
// checkpoints it resumes from).
type child struct {
	n     int // 1-based
	feeds []int
	dir   string
	args  []string
	done  chan struct{}

	mu struct {
		sync.Mutex
		cmd      *exec.Cmd
		stopping bool
		restarts int
		sums     []CollectorSummary // one per run that printed one
	}
}

// splitFeeds assigns changefeeds 1..feeds round-robin to n processes.
func splitFeeds(feeds, n int) [][]int {
	out := make([][]int, n)
	for f := 1; f <= feeds; f++ {
		out[(f-1)%n] = append(out[(f-1)%n], f)
	}
	return out
}

// collectorArgs are the arguments of a collector process serving feeds
// from dataDir: the command, then its flags (flags it does not set keep
// their defaults).
func collectorArgs(cfg Config, addr string, startTs uint64, feeds []int, dataDir string) []string {
	fs := make([]string, len(feeds))
	for i, f := range feeds {
		fs[i] = strconv.Itoa(f)
	}
	metrics := ""
	if cfg.MetricsAddr != "" {
		metrics = "127.0.0.1:0"
	}
	args := []string{Command, "--role", RoleCollector, "--connect", addr, "--start-ts", strconv.FormatUint(startTs, 10),
		"--changefeeds", strconv.Itoa(cfg.Changefeeds), "--tables", strconv.Itoa(cfg.Tables), "--feeds", strings.Join(fs, ","),
		"--data-dir", dataDir, "--inbox-capacity", strconv.Itoa(cfg.InboxCapacity), "--log-level", cfg.LogLevel,
		"--metrics-addr", metrics}
	if cfg.TLSCert != "" {
		args = append(args, "--tls-cert", cfg.TLSCert, "--tls-key", cfg.TLSKey, "--tls-ca", cfg.TLSCA)
	}
	return args
}

// startCollectorProcesses starts --remote-collectors collector processes,
// the changefeeds split among them, each dialling addr (or its
// --collector-connect address) from start, and supervises each in a
// goroutine of its own (stopCollectors stops them).
func (s *server) startCollectorProcesses(addr string, start uint64, stderr io.Writer) error {
	exe := s.cfg.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("collector processes: %w", err)
		}
	}
	var dial []string
	if s.cfg.CollectorConnect != "" {
		dial = strings.Split(s.cfg.CollectorConnect, ",")
	}
	for i, feeds := range splitFeeds(s.cfg.Changefeeds, s.cfg.RemoteCollectors) {
		c := &child{n: i + 1, feeds: feeds, dir: filepath.Join(s.dataDir, fmt.Sprintf("collector-%d", i+1)), done: make(chan struct{})}
		connect := addr
		if dial != nil {
			connect = strings.TrimSpace(dial[i])
		}
		c.args = collectorArgs(s.cfg, connect, start, feeds, c.dir)
		for _, f := range feeds {
			s.rs.sinkDirs[f] = c.dir
		}
		s.rs.children = append(s.rs.children, c)
		go c.supervise(exe, stderr, s.log)
	}
	return nil
}

// supervise runs the collector process, and runs it again on its data dir
// when it exits without being asked to, at most maxRestarts times.
func (c *child) supervise(exe string, stderr io.Writer, lg *zap.Logger) {
	defer close(c.done)
	for {
		var out bytes.Buffer
		cmd := exec.Command(exe, c.args...)
		cmd.Stdout, cmd.Stderr = &out, stderr
		c.mu.Lock()
		if c.mu.stopping {
			c.mu.Unlock()
			return
		}
		if err := cmd.Start(); err != nil {
			c.mu.Unlock()
			lg.Error("start collector process", zap.Int("collector", c.n), zap.Error(err))
			return
		}
		c.mu.cmd = cmd
		c.mu.Unlock()
		fmt.Fprintf(stderr, "collector %d started: pid %d, changefeeds %v\n", c.n, cmd.Process.Pid, c.feeds)
		err := cmd.Wait()
		c.mu.Lock()
		var sum CollectorSummary
		if json.Unmarshal(out.Bytes(), &sum) == nil {
			c.mu.sums = append(c.mu.sums, sum)
		}
		stopping := c.mu.stopping
		if !stopping {
			c.mu.restarts++
		}
		restarts := c.mu.restarts
		c.mu.Unlock()
		if stopping {
			return
		}
		if restarts > maxRestarts {
			lg.Error("collector process keeps exiting; giving up", zap.Int("collector", c.n), zap.Error(err))
			return
		}
		fmt.Fprintf(stderr, "collector %d exited (%v); restarting it on its data dir\n", c.n, err)
		time.Sleep(100 * time.Millisecond) // a restart delay, not synchronisation
	}
}

// stop asks the process to stop (SIGTERM) and waits for it, killing it
// after grace.
func (c *child) stop(grace time.Duration) {
	c.mu.Lock()
	c.mu.stopping = true
	if c.mu.cmd != nil && c.mu.cmd.ProcessState == nil {
		_ = c.mu.cmd.Process.Signal(syscall.SIGTERM)
	}
	c.mu.Unlock()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	}
	c.mu.Lock()
	if c.mu.cmd != nil {
		_ = c.mu.cmd.Process.Kill()
	}
	c.mu.Unlock()
	<-c.done
}

// stopCollectors stops the collector processes (or, with collectors
// started by hand, waits up to DrainTimeout for them to disconnect).
func (s *server) stopCollectors(stderr io.Writer) {
	if len(s.rs.children) > 0 {
		var wg sync.WaitGroup
		for _, c := range s.rs.children {
			wg.Go(func() { c.stop(15 * time.Second) })
		}
		wg.Wait()
		return
	}
	if s.rs.srv.Connected() == 0 {
		return
	}
	fmt.Fprintln(stderr, "service: delivery done; stop the collectors (Ctrl-C or SIGTERM) so that their sinks can be verified")
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	for s.rs.srv.Connected() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling a process we do not own
	}
}

// remoteTotals adds up the collector processes' summaries.
func (s *server) remoteTotals(sum *Summary) {
	for _, c := range s.rs.children {
		c.mu.Lock()
		sum.CollectorRestarts += c.mu.restarts
		for _, cs := range c.mu.sums {
			sum.RowsApplied += cs.RowsApplied
			sum.Resets += cs.Resets
			sum.Reconnects += cs.Reconnects
			sum.Reregistered += cs.Reregistered
		}
		c.mu.Unlock()
	}
}
