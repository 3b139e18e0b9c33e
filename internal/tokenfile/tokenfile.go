// Package tokenfile reads the bearer tokens of HTTP callers from a file,
// one "name secret" a line, and finds the caller a token names: the format
// of idemgate-mcp's -caller-token-file and rest-payments' -caller-token-file.
package tokenfile

import (
	"crypto/subtle"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"runtime"
	"strings"
)

// CheckPrivate refuses the file fi describes, given at path with flag and
// holding what (such as "every caller's secret"), when group or others may
// read or write it, with the chmod that fixes it. Windows, which has no
// Unix permission bits, passes.
func CheckPrivate(flag, path, what string, fi fs.FileInfo) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s %s is open to group or others (mode %#o) and holds %s: run chmod 600 %s", flag, path, perm, what, path)
	}
	return nil
}

// ReadPrivate reads the file at path, given with flag and holding what,
// once CheckPrivate passes on the file it opened (not on the path, which
// may be replaced between the two).
func ReadPrivate(flag, path, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if err := CheckPrivate(flag, path, what, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return b, nil
}

// Read reads file, named in errors by flagName (such as
// "-caller-token-file"): one "name secret" a line; blank lines and lines
// starting with # are skipped. A file group or others may read or write is
// refused (CheckPrivate), as dedupesvc refuses its -token-file. checkName, when not nil, refuses a name.
// Two secrets of one name are one caller, as while a secret is rotated; a
// secret on two lines is refused, as is a file with no token. It returns
// each secret's name.
func Read(flagName, file string, checkName func(string) error) (map[string]string, error) {
	b, err := ReadPrivate(flagName, file, "every caller's secret")
	if err != nil {
		return nil, err
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
