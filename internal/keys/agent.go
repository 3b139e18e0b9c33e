package keys

// AgentHeader is the metadata key in which a gate names the end caller (its
// tenant) on its Begins, so a Dedupe service that trusts the tool server to
// forward (dedupesvc/auth.Config.Forwarders) applies its Begin rate per
// agent. Binary ("-bin"), so any UTF-8 name travels; grpc-go refuses other
// header values that are not printable ASCII.
const AgentHeader = "idemgate-agent-bin"
