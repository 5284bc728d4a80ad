package linewatch

import (
	"bytes"
	"regexp"
	"sync"
)

// matchBuffer is how many matches wait for a reader before more are
// dropped.
const matchBuffer = 16

// Watcher keeps what is written and sends the submatches of every line
// that matches its pattern to Matches.
type Watcher struct {
	pattern *regexp.Regexp
	matches chan []string

	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte
}

// New watches for lines matching pattern (a regexp; it panics on a bad
// one, as regexp.MustCompile does: the pattern is the test's).
func New(pattern string) *Watcher {
	return &Watcher{pattern: regexp.MustCompile(pattern), matches: make(chan []string, matchBuffer)}
}

// Matches receives FindStringSubmatch of each matching line, in order.
func (w *Watcher) Matches() <-chan []string { return w.matches }

// Write implements io.Writer; it never fails or blocks.
func (w *Watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		if m := w.pattern.FindStringSubmatch(string(w.partial[:i])); m != nil {
			select {
			case w.matches <- m:
			default:
			}
		}
		w.partial = w.partial[i+1:]
	}
}

// String returns everything written so far.
func (w *Watcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}
