package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/console"
)

const unknownTotal = `id="total-unknown"><a href="/records?state=unknown">`

// TestOverviewShowsTheLastCountAndRecountsInTheBackground: counting scans
// every record, so the overview shows the last count, says when it was
// made, and recounts in the background once it is older than
// CountsMaxAge; a negative CountsMaxAge counts on every page.
func TestOverviewShowsTheLastCountAndRecountsInTheBackground(t *testing.T) {
	t.Parallel()
	t.Run("kept", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, func(c *console.Config) { c.CountsMaxAge = time.Hour })
		f.unknown(t, "blocked-1")
		b := f.browser(t)
		b.signedIn()
		f.unknown(t, "blocked-2")
		_, page := b.get("/")
		if !strings.Contains(page, unknownTotal+"1</a>") || !strings.Contains(page, `id="counted">Counted at `) || !strings.Contains(page, "older than 1h0m0s") {
			t.Fatalf("within CountsMaxAge the overview does not show the last count (1 unknown) and when it was made:\n%s", page)
		}
		// The list is read as the page is.
		if !strings.Contains(page, "blocked-2") {
			t.Fatalf("the outcome-unknown list is not read as the page is:\n%s", page)
		}
	})
	t.Run("recounted", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, func(c *console.Config) { c.CountsMaxAge = time.Nanosecond })
		f.unknown(t, "blocked-1")
		b := f.browser(t)
		b.signedIn()
		f.unknown(t, "blocked-2")
		// Each page past CountsMaxAge starts a recount and shows the count
		// before it; one of them shows the new count. Bounded, not timed.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			_, page := b.get("/")
			if strings.Contains(page, unknownTotal+"2</a>") {
				break
			}
			if !strings.Contains(page, unknownTotal+"1</a>") {
				t.Fatalf("the overview shows neither the old count nor the new one:\n%s", page)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no recount shown after 30s:\n%s", page)
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	t.Run("every page", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, func(c *console.Config) { c.CountsMaxAge = -1 })
		b := f.browser(t)
		b.signedIn()
		f.unknown(t, "blocked-1")
		if _, page := b.get("/"); !strings.Contains(page, unknownTotal+"1</a>") {
			t.Fatalf("with a negative CountsMaxAge the overview does not count as the page is:\n%s", page)
		}
	})
}
