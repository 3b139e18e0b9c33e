// Package mcptest tests the MCP bridge (cmd/idemgate-mcp) with clients
// nobody here wrote, against the real payments-server and dedupesvc
// binaries: the official Go SDK's client, the official TypeScript SDK's
// client (a Node script in node/, driven from Go), and the stdlib-only Python
// agent example (examples/mcp-python-agent). Under CI=true a missing node,
// npm package or python3 fails the test instead of skipping it.
package mcptest
