// Package mcptest tests the MCP bridge (cmd/idemgate-mcp) with clients
// nobody here wrote, against the real payments-server and dedupesvc
// binaries: the official Go SDK's client, the official TypeScript SDK's
// client at 2025-11-25 (@modelcontextprotocol/sdk 1.32.2, node/client.mjs,
// driven from Go), its v2 client pinned to 2026-07-28
// (@modelcontextprotocol/client 2.4.0, node/client2026.mjs), and the two agent
// examples (examples/mcp-python-agent, stdlib only; examples/mcp-typescript-
// agent, the TypeScript SDK). The fault tests put the bridge in front of the
// chaos suite's tool server, killed or stalled after its side effect. The
// TypeScript SDK's clients also run the same scripts against the native Go
// server gated by mcpgate (examples/mcp-server), the Python agent example
// runs against both servers at 2026-07-28 and at 2025-11-25, and the Go
// agent example (examples/mcp-go-agent) runs against that server's binary,
// over stdio and over HTTP on the real dedupesvc binary on PostgreSQL
// (pgtest). Under
// CI=true a missing node, npm package, python3 or PostgreSQL fails the test
// instead of skipping it (.ci/run installs them; make npm-ci installs the
// packages).
package mcptest
