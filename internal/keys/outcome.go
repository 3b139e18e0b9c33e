package keys

// OutcomeBytesHeader is the metadata key in which a gate declares, on a
// Finish, the size of its outcome (type URL plus value, in decimal bytes),
// so the Dedupe service can charge the caller's outcome-byte budget from
// the headers, before it reads the message.
const OutcomeBytesHeader = "idemgate-outcome-bytes"
