package mcpbridge

import (
	"context"
	"crypto/subtle"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// CallerAuth wraps h (HTTPHandler's) so that only callers presenting one of
// tokens (secret to caller name) as "Authorization: Bearer <secret>" reach
// it; others get 401. Every secret is compared, in constant time. The
// caller's name is the request's auth.TokenInfo UserID. idemgate-mcp
// -caller-token-file serves its callers through it.
func CallerAuth(tokens map[string]string, h http.Handler) http.Handler {
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		name := ""
		for secret, n := range tokens {
			if subtle.ConstantTimeCompare([]byte(secret), []byte(token)) == 1 {
				name = n
			}
		}
		if name == "" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: name}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}
