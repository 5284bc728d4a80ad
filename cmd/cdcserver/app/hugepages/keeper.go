package hugepages

import (
	"errors"
	"sync"
	"time"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
)

var (
	// ErrUnsupported: the system has no transparent huge pages to ask for
	// (not Linux).
	ErrUnsupported = errors.New("hugepages: not supported on this system")
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("hugepages: invalid options")
)

// MinBytes is the smallest mapping advised: one huge page (2 MiB on
// amd64 and arm64 with 4 KiB pages). A smaller one cannot hold one.
const MinBytes = 2 << 20

// Options configure a Keeper.
type Options struct {
	// Interval is how often the mappings are advised again (the heap's
	// new ones). Default 1s.
	Interval time.Duration
	// Clock defaults to the real clock.
	Clock clock.Clock
}

// Keeper advises the process's large anonymous mappings now and every
// Interval, until Close.
type Keeper struct {
	opts Options
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
	// passed, if set (tests), runs after each periodic pass.
	passed func()
}

// New validates opts; it starts nothing.
func New(opts Options) (*Keeper, error) {
	if opts.Interval == 0 {
		opts.Interval = time.Second
	}
	p := optcheck.New(ErrInvalidOptions)
	p.Require(opts.Interval >= time.Millisecond, "Interval %v must be at least 1ms", opts.Interval)
	p.NotTypedNil("Clock", opts.Clock)
	if err := p.Err(); err != nil {
		return nil, err
	}
	opts.Clock = clock.OrReal(opts.Clock)
	return &Keeper{opts: opts, stop: make(chan struct{})}, nil
}

// Start advises the mappings once, before it returns (memory allocated
// after it is backed by huge pages as it is touched), then starts the
// goroutine that advises them again every Interval. It returns
// ErrUnsupported, starting nothing, where Advise does. Call it once.
func (k *Keeper) Start() error {
	if _, err := Advise(); err != nil {
		return err
	}
	t := k.opts.Clock.NewTicker(k.opts.Interval)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		defer t.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-t.C():
			}
			_, _ = Advise() // a mapping gone since the read is no loss
			if k.passed != nil {
				k.passed()
			}
		}
	}()
	return nil
}

// Close stops the goroutine and waits for it. It is idempotent and may be
// called without Start.
func (k *Keeper) Close() {
	k.once.Do(func() { close(k.stop) })
	k.wg.Wait()
}
