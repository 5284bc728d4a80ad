package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// transportForBench is what the benchmark sends through: the service's
// side (Transport and RoomNotifier) and the collector's inbox.
type transportForBench struct {
	tr    messaging.Transport
	room  messaging.RoomNotifier
	inbox *messaging.Inbox
	close func()
}

func inProcessForBench(b *testing.B, capacity int) transportForBench {
	ip, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: capacity})
	if err != nil {
		b.Fatal(err)
	}
	inbox, err := ip.Register("c1")
	if err != nil {
		b.Fatal(err)
	}
	return transportForBench{tr: ip, room: ip, inbox: inbox, close: ip.Close}
}

func grpcForBench(b *testing.B, capacity int) transportForBench {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(lis, &controlForTest{calls: make(chan any, 1)}); err != nil {
		b.Fatal(err)
	}
	cli, err := NewClient(ClientOptions{Addr: lis.Addr().String(), Target: "c1", Capacity: capacity})
	if err != nil {
		b.Fatal(err)
	}
	if err := cli.Start(); err != nil {
		b.Fatal(err)
	}
	for srv.Send("c1", nil) != nil { // until the stream is up
		<-srv.Room("c1")
	}
	return transportForBench{tr: srv, room: srv, inbox: cli.Inbox(), close: func() { cli.Close(); srv.Close() }}
}

// BenchmarkTransportRows sends DML batches (64 rows of 100-byte values
// each) from one sender to one collector that drains as fast as it can,
// through the in-process transport and through gRPC on loopback (the wire
// encoding, the stream, credit flow control and the client's forward into
// its inbox). A refused send waits on Room, as the service does. One op is
// one row delivered; rows/s is the figure to compare.
func BenchmarkTransportRows(b *testing.B) {
	const rowsPerBatch, valueBytes, capacity = 64, 100, 4096
	for _, tc := range []struct {
		name string
		open func(*testing.B, int) transportForBench
	}{{"inprocess", inProcessForBench}, {"grpc", grpcForBench}} {
		b.Run(fmt.Sprintf("transport=%s", tc.name), func(b *testing.B) {
			t := tc.open(b, capacity)
			defer t.close()
			rows := make([]common.Row, rowsPerBatch)
			for i := range rows {
				rows[i] = common.Row{Op: common.OpPut, Key: []byte(fmt.Sprintf("key-%08d", i)), Value: make([]byte, valueBytes),
					StartTs: common.Ts(i + 1), CommitTs: common.Ts(i + 2)}
			}
			batches := (b.N + rowsPerBatch - 1) / rowsPerBatch
			var wg sync.WaitGroup
			var received int
			var recvErr error
			b.SetBytes(valueBytes) // per row: MB/s is value bytes
			b.ResetTimer()
			wg.Go(func() {
				var buf []messaging.Message
				for received < batches {
					var err error
					buf, err = t.inbox.Receive(context.Background(), buf[:0], 256)
					if err != nil {
						recvErr = err
						return
					}
					received += len(buf)
					clear(buf)
				}
			})
			for i := range batches {
				msg := []messaging.Message{&messaging.DMLBatch{Header: messaging.Header{Dispatcher: common.DispatcherID{Lo: 1},
					Registration: 1, Epoch: 1, Seq: uint64(i + 2)}, Rows: rows}}
				for {
					err := t.tr.Send("c1", msg)
					if err == nil {
						break
					}
					if !errors.Is(err, messaging.ErrBusy) {
						b.Fatal(err)
					}
					<-t.room.Room("c1")
				}
			}
			wg.Wait()
			b.StopTimer()
			if recvErr != nil {
				b.Fatal(recvErr)
			}
			b.ReportMetric(float64(batches*rowsPerBatch)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
