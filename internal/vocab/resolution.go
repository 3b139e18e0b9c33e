package vocab

import "google.golang.org/protobuf/proto"

// Resolution is a Reconciler's answer (idemgate.Resolution). Its zero value
// is StillUnknown, so a reconciler that returns one says it cannot tell.
type Resolution struct {
	kind     Kind
	response proto.Message
	err      error
}

// Kind is what a Resolution says happened.
type Kind int

const (
	// StillUnknown: the reconciler cannot tell.
	StillUnknown Kind = iota
	// ResolvedResponse: the side effect happened; Read's response is the
	// method's answer.
	ResolvedResponse
	// ResolvedError: the action ended with Read's error, a final one.
	ResolvedError
	// ResolvedNotRun: the side effect did not happen.
	ResolvedNotRun
)

// Resolve returns the Resolution of kind k with resp or err (each only for
// its kind; the constructors in package idemgate pass the right one).
func Resolve(k Kind, resp proto.Message, err error) Resolution {
	return Resolution{kind: k, response: resp, err: err}
}

// Read returns what r says: its kind, and the response or the error its
// kind carries.
func Read(r Resolution) (k Kind, resp proto.Message, err error) {
	return r.kind, r.response, r.err
}
