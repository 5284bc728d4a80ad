package messaging_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// A sender meets back-pressure when the receiver does not drain, and gets
// through once it does.
func Example() {
	tr, _ := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 2})
	defer tr.Close()
	inbox, _ := tr.Register("collector-1")

	d := common.DispatcherIDFromUint64(7)
	hs := &messaging.Handshake{Header: messaging.Header{Dispatcher: d, Epoch: 1, Seq: 1}, StartTs: 100}
	// A resolved carries the current seq without incrementing it.
	res := &messaging.Resolved{Header: messaging.Header{Dispatcher: d, Epoch: 1, Seq: 1}, Ts: 105}
	dml := &messaging.DMLBatch{
		Header: messaging.Header{Dispatcher: d, Epoch: 1, Seq: 2},
		Rows:   []common.Row{{Op: common.OpPut, Key: []byte("k"), StartTs: 105, CommitTs: 106}},
	}

	fmt.Println(tr.Send("collector-1", []messaging.Message{hs, res}))
	err := tr.Send("collector-1", []messaging.Message{dml})
	fmt.Println(errors.Is(err, messaging.ErrBusy))

	msgs, _ := inbox.Receive(context.Background(), nil, 0)
	for _, m := range msgs {
		fmt.Println(m.Kind(), m.MessageHeader().Seq)
	}
	fmt.Println(tr.Send("collector-1", []messaging.Message{dml}))
	// Output:
	// <nil>
	// true
	// handshake 1
	// resolved 1
	// <nil>
}
