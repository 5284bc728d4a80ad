package pendingset

// fifo is the ready FIFO: a ring of node numbers that can also take a node
// at its front (keys returned by a whole-batch failure were pending before
// anything queued since). It was an intrusive list through the nodes; a
// ring lets Drain read the next node numbers without first reading the
// nodes they are in, so the cache misses of a batch's nodes and slots
// overlap instead of forming a chain, which is what a key stream in no
// particular order costs (scripts/wqbench, live consumer).
//
// A node is in the FIFO at most once, so the ring never holds more than
// the number of nodes; it grows by doubling and never shrinks, like the
// node slice.
type fifo struct {
	buf  []int32 // len is 0 or a power of two
	head int     // position of the oldest entry
	len  int
}

// push appends i, or prepends it if front.
func (f *fifo) push(i int32, front bool) {
	if f.len == len(f.buf) {
		f.grow()
	}
	mask := len(f.buf) - 1
	if front {
		f.head = (f.head - 1) & mask
		f.buf[f.head] = i
	} else {
		f.buf[(f.head+f.len)&mask] = i
	}
	f.len++
}

// front is the oldest entry. REQUIRES: f.len > 0.
func (f *fifo) front() int32 { return f.buf[f.head] }

// pop removes and returns the oldest entry. REQUIRES: f.len > 0.
func (f *fifo) pop() int32 {
	i := f.buf[f.head]
	f.head = (f.head + 1) & (len(f.buf) - 1)
	f.len--
	return i
}

// at is the j-th oldest entry. REQUIRES: 0 <= j < f.len.
func (f *fifo) at(j int) int32 { return f.buf[(f.head+j)&(len(f.buf)-1)] }

// grow doubles the ring, moving the entries to its start in order.
func (f *fifo) grow() {
	buf := make([]int32, max(8, 2*len(f.buf)))
	for j := range f.len {
		buf[j] = f.at(j)
	}
	f.buf, f.head = buf, 0
}
