package mcpbridge

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/keys"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/tokenfile"
)

// Several HTTP callers authenticated by CallerAuth share one bridge, and
// every call reaches the tool server under the bridge's one identity: at its
// gate they are one tenant. So the bridge forwards an authenticated caller's
// key as "<name>/<key>" and refuses its keyless calls to gated tools; a call
// without a caller (stdio, HTTP without CallerAuth) is forwarded unchanged.
const (
	// CallerKeySeparator ends the caller's name in the key forwarded for an
	// authenticated caller ("alice/order-1"). CheckCallerName keeps it out
	// of names, so the first one ends the name and no caller can send a key
	// that lands in another's.
	CallerKeySeparator = "/"
	// MaxCallerNameBytes is the longest caller name, so every caller keeps
	// at least 190 of the gate's 255 bytes (keys.MaxBytes) for its keys.
	MaxCallerNameBytes = 64
)

// CheckCallerName reports why name cannot name a caller: it must be 1 to
// MaxCallerNameBytes bytes of ASCII letters, digits, '.', '_' and '-'.
func CheckCallerName(name string) error {
	if name == "" || len(name) > MaxCallerNameBytes {
		return fmt.Errorf("caller name %q: want 1 to %d bytes", name, MaxCallerNameBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("caller name %q: only ASCII letters, digits, '.', '_' and '-' (a %q would be ambiguous in the stored key <name>%s<key>)", name, c, CallerKeySeparator)
		}
	}
	return nil
}

// CallerAuth wraps h (HTTPHandler's) so that only callers presenting one of
// tokens (secret to caller name, each name valid by CheckCallerName) as
// "Authorization: Bearer <secret>" reach it; others get 401. Every secret
// is compared, in constant time. The caller's name is the request's
// auth.TokenInfo UserID, by which the bridge gives each caller its own
// keys. idemgate-mcp -caller-token-file serves its callers through it.
func CallerAuth(tokens map[string]string, h http.Handler) http.Handler {
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		name := tokenfile.Lookup(tokens, token)
		if name == "" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: name}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}

// callerOf returns the name of the request's authenticated caller, "" when
// it has none (stdio, HTTP without CallerAuth). A token info whose name is
// not a caller name is refused rather than forwarded unprefixed.
func callerOf(req *mcp.CallToolRequest) (string, error) {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return "", nil
	}
	name := req.Extra.TokenInfo.UserID
	if err := CheckCallerName(name); err != nil {
		return "", grpcerr.New(codes.Unauthenticated, mcpwire.ReasonUnauthenticated,
			"the bridge cannot give this caller keys of its own: "+err.Error(), nil, 0)
	}
	return name, nil
}

// callerKey is the key forwarded for caller's key: "<caller>/<key>". key
// must be a valid key by itself (the prefix would hide an empty key or a
// leading space), and the whole within keys.MaxBytes: a longer one is
// refused, never cut, since two keys cut alike would be one action.
func callerKey(caller, key string) (string, error) {
	prefix := caller + CallerKeySeparator
	limit := keys.MaxBytes - len(prefix)
	meta := map[string]string{"maxKeyBytes": strconv.Itoa(limit)}
	if len(key) > limit {
		return "", grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
			fmt.Sprintf("the idempotency key is %d bytes long; this bridge stores a caller's key as %s<key>, so %s's keys may be at most %d bytes (%d with the prefix): use a shorter key, such as a UUID",
				len(key), prefix, caller, limit, keys.MaxBytes), meta, 0)
	}
	if err := keys.Validate(key); err != nil {
		return "", grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
			fmt.Sprintf("the idempotency key %s: use 1 to %d bytes of printable ASCII without leading or trailing spaces, such as a UUID", err, limit), meta, 0)
	}
	return prefix + key, nil
}

// keylessShared is why a bridge shared by callers forwards no keyless
// call to a gated tool.
const keylessShared = "; this bridge is shared by several callers, so it forwards no call without a key: the tool server would deduplicate it on its arguments for all of them as one caller"

// keyField is md's request field marked (idemgate.v1.field).idempotency_key
// (a top-level string, as the gate reads it), or nil.
func keyField(md protoreflect.MethodDescriptor) protoreflect.FieldDescriptor {
	fields := md.Input().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		opts, _ := fd.Options().(*descriptorpb.FieldOptions)
		if opts == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated || !proto.HasExtension(opts, idemgatev1.E_Field) {
			continue
		}
		if p, _ := proto.GetExtension(opts, idemgatev1.E_Field).(*idemgatev1.FieldPolicy); p.GetIdempotencyKey() {
			return fd
		}
	}
	return nil
}

// forCaller rewrites a call of an authenticated caller: the key, from the
// MCP carriers (key, hasKey) or the request's key field (kf, in in), is
// forwarded as callerKey's, in the metadata and in the field when the
// request sent it there (the two must agree at the gate); a keyless call
// to a gated tool is refused (keylessShared). It returns the key to send.
func forCaller(caller string, key string, hasKey bool, in protoreflect.Message, kf protoreflect.FieldDescriptor, gated bool, keyArg string) (string, bool, error) {
	inField := false
	if kf != nil {
		if v := in.Get(kf).String(); v != "" {
			if hasKey && v != key {
				return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyConflict,
					fmt.Sprintf("%s and the argument %s carry different idempotency keys; send one, or the same in both", mcpwire.CallKeyCarriers, kf.JSONName()),
					map[string]string{"field": kf.JSONName()}, 0)
			}
			key, hasKey, inField = v, true, true
		}
	}
	if !hasKey {
		if !gated {
			return "", false, nil
		}
		return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyMissing,
			mcpwire.KeyMissingMessage(keyArgNames(keyArg)...)+keylessShared, nil, 0)
	}
	forwarded, err := callerKey(caller, key)
	if err != nil {
		return "", false, err
	}
	if inField {
		in.Set(kf, protoreflect.ValueOfString(forwarded))
	}
	return forwarded, true, nil
}
