// Package tokenfile reads the bearer tokens of HTTP callers from a file,
// one "name secret" a line, and finds the caller a token names: the format
// of idemgate-mcp's -caller-token-file and rest-payments' -caller-token-file.
package tokenfile

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// Read reads file, named in errors by flagName (such as
// "-caller-token-file"): one "name secret" a line; blank lines and lines
// starting with # are skipped. checkName, when not nil, refuses a name.
// Two secrets of one name are one caller, as while a secret is rotated; a
// secret on two lines is refused, as is a file with no token. It returns
// each secret's name.
func Read(flagName, file string, checkName func(string) error) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	tokens := map[string]string{} // secret -> name
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s %s line %d: want \"name secret\"", flagName, file, i+1)
		}
		if checkName != nil {
			if err := checkName(fields[0]); err != nil {
				return nil, fmt.Errorf("%s %s line %d: %w", flagName, file, i+1, err)
			}
		}
		if _, dup := tokens[fields[1]]; dup {
			return nil, fmt.Errorf("%s %s line %d: the secret of another line", flagName, file, i+1)
		}
		tokens[fields[1]] = fields[0]
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%s %s lists no token", flagName, file)
	}
	return tokens, nil
}

// Lookup returns the name of the caller whose secret is token, comparing
// every secret in constant time; "" when none is.
func Lookup(tokens map[string]string, token string) string {
	name := ""
	for secret, n := range tokens {
		if subtle.ConstantTimeCompare([]byte(secret), []byte(token)) == 1 {
			name = n
		}
	}
	return name
}

// Bearer returns r's "Authorization: Bearer <token>" token, "" when it has
// none.
func Bearer(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}
