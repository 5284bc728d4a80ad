package common

import "errors"

// ErrInvalidSpan is returned (wrapped) for a span that fails validation.
var ErrInvalidSpan = errors.New("invalid span")
