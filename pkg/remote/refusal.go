package remote

import (
	"fmt"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// A caller with an identity (the server has a Policy) learns nothing from a
// refusal about objects that are not its own. The service decides a request
// under its lock and explains a failure for its operator: "registration 9,
// current 42" names the registration of a dispatcher the caller may not
// touch, and the codes tell "someone else's" (stale registration, permission
// denied) from "nobody's" (unknown dispatcher). So at the trust boundary,
// for such a caller:
//
//   - a Reset or Remove refused as unknown, stale or another target's is
//     one outcome, CodeUnknownDispatcher ("no registration the caller may
//     act for by that dispatcher and registration"), and so is a heartbeat
//     entry's: whether the dispatcher exists under another identity, under
//     another registration, or not at all, the caller gets the same code
//     and the same words;
//   - every explanation is written here from the code and what the caller
//     sent, never from the service's text (which the service logs);
//   - a Register still says that a dispatcher ID is taken (IDs are one
//     namespace: a register of a free one succeeds), never by whom or
//     under which registration.
//
// A caller without an identity (no Policy: loopback or in process) is the
// service's operator and gets the service's explanation as it is.

// concealed reports whether code, for a request about an existing
// registration, would tell the caller more than "not one of yours".
func concealed(code messaging.Code) bool {
	switch code {
	case messaging.CodeUnknownDispatcher, messaging.CodeStaleRegistration, messaging.CodePermissionDenied:
		return true
	}
	return false
}

// redactCodes folds the entry codes of a heartbeat that would tell another
// identity's dispatcher from a missing one into CodeUnknownDispatcher.
func redactCodes(codes []messaging.Code) {
	for i, c := range codes {
		if concealed(c) {
			codes[i] = messaging.CodeUnknownDispatcher
		}
	}
}

// redactedReply is the code and explanation a caller with authority a
// gets for request r that the control plane answered with err (the
// entries' codes are redacted in place).
func redactedReply(a messaging.Authority, r controlRequest, err error, codes []messaging.Code) (messaging.Code, string) {
	if r.op == opHeartbeat {
		redactCodes(codes)
	}
	code := messaging.CodeOf(err)
	if err == nil {
		return code, ""
	}
	who := a.Identity()
	switch r.op {
	case opReset, opRemove:
		op, id, reg := "reset", r.reset.Dispatcher, r.reset.Registration
		if r.op == opRemove {
			op, id, reg = "remove", r.remove.Dispatcher, r.remove.Registration
		}
		if concealed(code) {
			return messaging.CodeUnknownDispatcher,
				fmt.Sprintf("%s: no registration %v of dispatcher %v that %q may act for", op, reg, id, who)
		}
		return code, fmt.Sprintf("%s of registration %v of dispatcher %v: %v", op, reg, id, code)
	case opRegister:
		q := r.register
		switch {
		case code == messaging.CodePermissionDenied && !a.MayServe(q.Target):
			return code, fmt.Sprintf("%q may not register under target %q", who, q.Target)
		case code == messaging.CodePermissionDenied:
			return code, fmt.Sprintf("%q may not take over dispatcher %v: it is registered under a target it does not serve", who, q.Dispatcher)
		case code == messaging.CodeDispatcherExists:
			return code, fmt.Sprintf("dispatcher %v is registered, not as registration %v", q.Dispatcher, q.Registration)
		}
		return code, fmt.Sprintf("register of dispatcher %v registration %v: %v", q.Dispatcher, q.Registration, code)
	}
	return code, fmt.Sprintf("%s: %v", opName(r.op), code)
}

// opName names a control op in an explanation.
func opName(op byte) string {
	switch op {
	case opRegister:
		return "register"
	case opRegisterBatch:
		return "register batch"
	case opReset:
		return "reset"
	case opRemove:
		return "remove"
	case opHeartbeat:
		return "heartbeat"
	}
	return "control call"
}
