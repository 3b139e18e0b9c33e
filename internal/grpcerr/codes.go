package grpcerr

import (
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"
)

// CodeName is c's name as google.rpc.Code spells it ("INVALID_ARGUMENT",
// "CANCELLED"): the spelling of a policy's replay_codes and unknown_codes,
// and of the codes idemgate names in its errors and logs on every
// transport. A code google.rpc.Code does not name keeps grpc's spelling
// ("Code(42)").
func CodeName(c codes.Code) string {
	if name, ok := code.Code_name[int32(c)]; ok {
		return name
	}
	return c.String()
}

// CodeByName is the code name spells: a google.rpc.Code name, or CANCELED,
// grpc-go's spelling of CANCELLED, which the interceptor wrote and alone
// accepted before the spellings were made one.
func CodeByName(name string) (codes.Code, bool) {
	if name == "CANCELED" {
		return codes.Canceled, true
	}
	v, ok := code.Code_value[name]
	return codes.Code(v), ok
}
