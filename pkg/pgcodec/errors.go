package pgcodec

import "errors"

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("pgcodec: malformed")
