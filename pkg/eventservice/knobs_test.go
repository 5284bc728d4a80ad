package eventservice

import "github.com/cdcflow/eventservice/pkg/messaging"

// hooks is the tests' view of the service's testingKnobs: one field per
// place a test holds or watches, translated into the knobs by knobs().
type hooks struct {
	beforePrepare     func(s *session)
	beforeScan        func(s *session)
	prepared          func(s *session, out prepareOutcome)
	scanned           func(s *session, out scanOutcome)
	scanChannelFull   func(s *session)
	beforeReRegister  func(d *dispatcher)
	targetStopping    func(name messaging.Target)
	beforePark        func(s *session)
	beforeFence       func(d *dispatcher)
	keepaliveRound    func(examined int)
	closeUnregistered func()
}

func (hk hooks) knobs() testingKnobs {
	k := testingKnobs{targetStopping: hk.targetStopping, keepaliveRound: hk.keepaliveRound}
	if hk.prepared != nil || hk.scanned != nil {
		k.ended = func(s *session, e effect) {
			switch {
			case e.kind == fxEndPrepare && hk.prepared != nil:
				hk.prepared(s, prepareOutcome(e.outcome))
			case e.kind == fxEndScan && hk.scanned != nil:
				hk.scanned(s, scanOutcome(e.outcome))
			}
		}
	}
	k.at = func(p point, s *session, d *dispatcher) {
		call := func(f func(*session)) {
			if f != nil {
				f(s)
			}
		}
		switch p {
		case pointBeforePrepare:
			call(hk.beforePrepare)
		case pointBeforeScan:
			call(hk.beforeScan)
		case pointScanChannelFull:
			call(hk.scanChannelFull)
		case pointBeforePark:
			call(hk.beforePark)
		case pointBeforeFence:
			if hk.beforeFence != nil {
				hk.beforeFence(d)
			}
		case pointBeforeReRegister:
			if hk.beforeReRegister != nil {
				hk.beforeReRegister(d)
			}
		case pointCloseUnregistered:
			if hk.closeUnregistered != nil {
				hk.closeUnregistered()
			}
		}
	}
	return k
}
