package chaos

import "time"

// DropClaim is the file chaos-tool -drop-first-finish publishes in its
// directory, named after the key (url.PathEscape), when it drops the first
// Finish of that key among the tool servers sharing the directory. The suite
// answers by cutting that tool server off from the Dedupe service, then
// creates the same name plus DropAckSuffix, which the tool server waits for
// (at most 5s) before it fails the Finish.
type DropClaim struct {
	// Server names the tool server, Pid its process; Key is the key whose
	// Finish is dropped; Time is when it was claimed.
	Server string    `json:"server"`
	Pid    int       `json:"pid"`
	Key    string    `json:"key"`
	Time   time.Time `json:"time"`
}

// DropAckSuffix ends the name of the suite's acknowledgement of a DropClaim.
const DropAckSuffix = ".cut"
