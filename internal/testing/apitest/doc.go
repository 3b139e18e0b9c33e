// Package apitest holds the gates' exported APIs to the one table that
// describes them all, docs/gating.md's "One shape across the gates": every
// name the table shows exists in its gate's package, every option a gate
// exports is shown, and the names every gate shares exist in all four.
package apitest
