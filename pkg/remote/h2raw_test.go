package remote

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// h2raw is a hostile HTTP/2 client, written by hand because gRPC's own
// sends a message whole: it opens Control calls and sends part of their
// requests, then nothing. It answers SETTINGS and PING (a peer that
// answers pings is what the bound must hold against) and honours the
// connection's flow-control window; it records the streams the server
// ended (RST_STREAM, or trailers).
type h2raw struct {
	t    *testing.T
	conn net.Conn
	next uint32 // the next stream ID

	wmu sync.Mutex // one frame at a time

	mu     sync.Mutex
	window int64 // the connection's send window
	cond   *sync.Cond
	ended  map[uint32]bool
	done   bool
}

// HTTP/2 frame types and flags (RFC 9113).
const (
	h2Data, h2Headers, h2RST, h2Settings, h2Ping, h2GoAway, h2WindowUpdate = 0, 1, 3, 4, 6, 7, 8
	h2EndStream, h2EndHeaders, h2Ack                                       = 1, 4, 1
)

func dialH2(t *testing.T, addr string) *h2raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	h := &h2raw{t: t, conn: c, next: 1, window: 65535, ended: map[uint32]bool{}}
	h.cond = sync.NewCond(&h.mu)
	_, err = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	require.NoError(t, err)
	h.frame(h2Settings, 0, 0, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.read()
	}()
	t.Cleanup(func() {
		_ = c.Close()
		<-done
	})
	return h
}

func (h *h2raw) frame(typ, flags byte, stream uint32, payload []byte) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], stream)
	_, _ = h.conn.Write(append(b, payload...)) // a closed connection shows in read
}

// read handles the server's frames until the connection ends.
func (h *h2raw) read() {
	defer func() {
		h.mu.Lock()
		h.done = true
		h.cond.Broadcast()
		h.mu.Unlock()
	}()
	head := make([]byte, 9)
	for {
		if _, err := io.ReadFull(h.conn, head); err != nil {
			return
		}
		n := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		typ, flags, stream := head[3], head[4], binary.BigEndian.Uint32(head[5:])&0x7fffffff
		payload := make([]byte, n)
		if _, err := io.ReadFull(h.conn, payload); err != nil {
			return
		}
		switch {
		case typ == h2Settings && flags&h2Ack == 0:
			h.frame(h2Settings, h2Ack, 0, nil)
		case typ == h2Ping && flags&h2Ack == 0:
			h.frame(h2Ping, h2Ack, 0, payload)
		case typ == h2WindowUpdate && stream == 0:
			h.mu.Lock()
			h.window += int64(binary.BigEndian.Uint32(payload) & 0x7fffffff)
			h.cond.Broadcast()
			h.mu.Unlock()
		case typ == h2RST || (typ == h2Headers && flags&h2EndStream != 0):
			h.mu.Lock()
			h.ended[stream] = true
			h.mu.Unlock()
		case typ == h2GoAway:
			return
		}
	}
}

// hpackLiteral encodes a header field as a literal without indexing, a
// new name, no Huffman coding (RFC 7541 6.2.2).
func hpackLiteral(b []byte, name, value string) []byte {
	b = append(b, 0, byte(len(name)))
	b = append(b, name...)
	b = append(b, byte(len(value)))
	return append(b, value...)
}

// slowControl opens a Control call announcing a request of size bytes
// and sends only its first sent bytes (at most the stream's window).
func (h *h2raw) slowControl(size uint32, sent int) uint32 {
	id := h.next
	h.next += 2
	var hb []byte
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", controlMethod}, {":authority", "x"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		hb = hpackLiteral(hb, f[0], f[1])
	}
	h.frame(h2Headers, h2EndHeaders, id, hb)
	body := make([]byte, 5+sent)
	binary.BigEndian.PutUint32(body[1:], size) // uncompressed, size bytes
	for len(body) > 0 {
		k := min(len(body), 16384) // the default largest frame
		h.mu.Lock()
		for h.window < int64(k) && !h.done {
			h.cond.Wait()
		}
		h.window -= int64(k)
		h.mu.Unlock()
		h.frame(h2Data, 0, id, body[:k])
		body = body[k:]
	}
	return id
}

// endedCount is the number of streams the server ended.
func (h *h2raw) endedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ended)
}
