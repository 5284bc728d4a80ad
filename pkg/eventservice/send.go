package eventservice

import (
	"errors"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// errRetired: an owner's session was retired (reset or removed) before its
// send; nothing was sent.
var errRetired = errors.New("eventservice: session retired")

// sendOwned sends msgs of s, which the caller owns, unless s was retired,
// holding s.d.sendMu from the check through the send: Remove's fence.
func (svc *Service) sendOwned(s *session, msgs []messaging.Message) error {
	d := s.d
	d.sendMu.Lock()
	defer d.sendMu.Unlock()
	if st, _ := s.sched.load(); st == stateRemoved {
		return errRetired
	}
	return svc.send(d.target.name, msgs)
}

// send hands msgs to the transport, counting refusals and failures.
func (svc *Service) send(to messaging.Target, msgs []messaging.Message) error {
	err := svc.opts.Transport.Send(to, msgs)
	switch {
	case err == nil:
		svc.metrics.sentMessages.Add(float64(len(msgs)))
	case errors.Is(err, messaging.ErrBusy):
		svc.metrics.sendRefusals.WithLabelValues("busy").Inc()
	case errors.Is(err, messaging.ErrBatchTooLarge):
		svc.metrics.sendRefusals.WithLabelValues("too_large").Inc()
	default:
		svc.metrics.sendRefusals.WithLabelValues("failed").Inc()
	}
	return err
}
