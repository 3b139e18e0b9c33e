//go:build !unix

package gobuild

import (
	"errors"
	"os"
)

// tryLock reports that this system has no lock Lock can use: builds run
// unserialized.
func tryLock(*os.File) (bool, error) { return false, errors.ErrUnsupported }
