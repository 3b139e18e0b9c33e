// Package tlsfiles serves a certificate and key, and a CA bundle, from PEM
// files that rotate under a running process (cert-manager, Vault, ACME), so
// a renewed certificate reaches new connections without a restart and
// connections already made keep theirs.
//
// The files are checked on use, not watched: a handshake that comes at
// least the check interval (DefaultCheckInterval, one second; see
// WithCheckInterval) after the last check reads them again,
// and a change is parsed and takes effect for that handshake and the ones
// after it. No goroutine, timer or signal is involved, so the same code
// serves a long-running service, a bridge and a tool server's client
// certificate alike, and an idle process does no work. The files are
// compared by content (a digest), not modification time, so a copy that
// keeps the old time (cp -p, rsync -t) is seen too.
//
// A change that does not parse, or a certificate whose key does not match
// (a pair caught half-written), keeps what is in force: handshakes go on
// with the previous pair or pool, the error is logged once per distinct
// content, and the next change is tried again. A reload is logged at info
// with the certificate's serial (hexadecimal, as openssl x509 -serial
// prints it) and notAfter.
package tlsfiles
