package tests

import (
	"bytes"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/linewatch"
)

// childProcess is a cdcserver process a test started: its stderr watched
// for the lines the test waits on, its exit delivered once on exited.
type childProcess struct {
	cmd    *exec.Cmd
	stderr *linewatch.Watcher
	exited chan struct{} // closed once the process has exited; err is then set
	err    error
}

// startChild starts cmd with stderr watched by stderr (stdout kept
// aside); the test's cleanup kills it if it is still running and waits.
func startChild(t testing.TB, cmd *exec.Cmd, stderr *linewatch.Watcher) *childProcess {
	t.Helper()
	p := &childProcess{cmd: cmd, stderr: stderr, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, stderr
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// wait waits for the process's exit and returns Wait's error.
func (p *childProcess) wait() error {
	<-p.exited
	return p.err
}
