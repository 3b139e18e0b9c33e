//go:build !unix

package dedupeapp

// canBindAlone: elsewhere checkListen does not bind alone; the listen
// after the store opens reports a taken port.
const canBindAlone = false

// bindAlone is not called where canBindAlone is false.
func bindAlone(uintptr, string, string) error { return nil }
