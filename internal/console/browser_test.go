package console_test

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// screenshots, when set, is the directory the browser test saves a PNG of
// each page to (docs/console/ keeps them): -console-screenshots=DIR, or
// IDEMGATE_CONSOLE_SCREENSHOTS.
var screenshots = flag.String("console-screenshots", os.Getenv("IDEMGATE_CONSOLE_SCREENSHOTS"), "save a PNG of each console page to this `directory`")

// smallPNG re-encodes a screenshot with the 256 colours it uses most (the
// console's pages have few; anti-aliased text takes the nearest), so the
// PNGs kept in docs/console/ stay small.
func smallPNG(raw []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	b := img.Bounds()
	freq := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			freq[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colors := make([]color.RGBA, 0, len(freq))
	for c := range freq {
		colors = append(colors, c)
	}
	slices.SortFunc(colors, func(a, b color.RGBA) int {
		if freq[a] != freq[b] {
			return freq[b] - freq[a]
		}
		return cmp.Compare(uint32(a.R)<<16|uint32(a.G)<<8|uint32(a.B), uint32(b.R)<<16|uint32(b.G)<<8|uint32(b.B))
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range colors[:min(256, len(colors))] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(b, pal)
	index := map[color.RGBA]uint8{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// chromium finds Debian's browser; under CI=true its absence fails the
// test, elsewhere it skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	msg := "no chromium in PATH: install it (apt-get install chromium) to run the console's browser test"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestConsoleInABrowser drives the console with headless Chromium as an
// operator would during an incident, over the Dedupe service of a real
// gated gRPC tool server: a client-role token refused; signed in with an
// admin token; a key the tool server blocked (its payment provider never
// answered) found on the overview, opened and released through its
// confirmation page, after which the same call runs the handler again;
// another completed with the outcome it had, typed as JSON, after which
// its call is a replay of it and the handler does not run; a completed
// key forgotten through its confirmation page, after which its
// call, replayed until then, runs the handler again.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	path := chromium(t)
	f := newToolFixture(t)
	for _, key := range []string{"order-1001", "order-1002", "order-1001"} {
		if resp, err := f.call(t, key, false); err != nil || resp.GetKey() != key {
			t.Fatalf("call %s: %v, %v", key, resp, err)
		}
	}
	for _, key := range []string{"order-1003", "order-1004"} {
		if _, err := f.call(t, key, true); status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != idemgate.ReasonOutcomeUnknown {
			t.Fatalf("call %s whose provider times out: %v, want FAILED_PRECONDITION %s", key, err, idemgate.ReasonOutcomeUnknown)
		}
	}
	// The blocked key refuses its retry without running the handler: only
	// an operator can say whether the charge happened.
	if _, err := f.call(t, "order-1003", false); grpcerr.Reason(err) != idemgate.ReasonOutcomeUnknown {
		t.Fatalf("retry of the blocked order-1003: %v, want %s", err, idemgate.ReasonOutcomeUnknown)
	}
	for key, want := range map[string]int{"order-1001": 1, "order-1002": 1, "order-1003": 1, "order-1004": 1} {
		if got := f.tool.runsOf(key); got != want {
			t.Fatalf("before the console: %s ran %d times, want %d", key, got, want)
		}
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1100, 760),
		chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	// A bound on the whole run, so a page that never shows fails the test
	// instead of hanging it; not a timing assertion.
	ctx, cancelRun := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelRun()

	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if *screenshots == "" {
				return nil
			}
			shot, err := chromedp.FullScreenshot(100)(ctx, t)
			if err == nil {
				shot, err = smallPNG(shot)
			}
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(*screenshots, name+".png"), shot, 0o644)
		})
	}
	if *screenshots != "" {
		if err := os.MkdirAll(*screenshots, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(what string, sel chromedp.CSS) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return s
	}

	base := f.server.URL
	run("sign in with a client-role token",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		shot("login"),
		chromedp.SendKeys(chromedp.CSS("#token"), clientToken),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("p.error")))
	if got := text("refusal", chromedp.CSS("p.error")); !strings.Contains(got, "no admin right") {
		t.Fatalf("client-role sign-in says %q, want that it has no admin right", got)
	}

	run("sign in with the admin token",
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#unknown-records")),
		shot("overview"))
	if got := text("store health", chromedp.CSS("#store-health")); !strings.Contains(got, "answering (the primary") {
		t.Fatalf("the overview shows the store as %q, want PostgreSQL answering as the primary", got)
	}

	run("open the blocked key from the overview",
		chromedp.Click(`//table[@id="unknown-records"]//a[text()="order-1003"]`),
		chromedp.WaitVisible(chromedp.CSS("#resolve")),
		shot("record"))
	if got := text("record state", chromedp.CSS("#state")); !strings.HasPrefix(got, "unknown since") {
		t.Fatalf("the record page shows state %q, want outcome-unknown", got)
	}
	run("release it through its confirmation",
		chromedp.Click(chromedp.CSS("#resolve")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-release")),
		shot("resolve"),
		chromedp.Click(chromedp.CSS("#confirm-release")),
		chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := text("result", chromedp.CSS("#result")); !strings.HasPrefix(got, "Released") {
		t.Fatalf("after release the page says %q", got)
	}
	if got := f.toolState(t, "order-1003"); got != "released" {
		t.Fatalf("order-1003 is %s after the browser released it, want released", got)
	}
	// The agent's retry now runs the charge: the operator said it did not
	// happen. Its next retry is a replay.
	for range 2 {
		if _, err := f.call(t, "order-1003", false); err != nil {
			t.Fatalf("call order-1003 after its release: %v", err)
		}
	}
	if got := f.tool.runsOf("order-1003"); got != 2 {
		t.Fatalf("order-1003 ran %d times after its release and two calls, want 2 (once blocked, once after release, then replayed)", got)
	}

	// The other blocked key's charge did happen: the operator completes it
	// with the provider's answer, typed as the method's response in JSON,
	// through its confirmation; the agent's retry gets that answer,
	// replayed, and the handler does not run again.
	run("complete the other blocked key with its outcome",
		chromedp.Navigate(base+"/records?state=unknown"),
		chromedp.WaitVisible(chromedp.CSS("#records")),
		chromedp.Click(`//table[@id="records"]//a[text()="order-1004"]`),
		chromedp.WaitVisible(chromedp.CSS("#resolve")),
		chromedp.Click(chromedp.CSS("#resolve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-json")),
		chromedp.SendKeys(chromedp.CSS("#outcome-json"), `{"payload": "charged by the provider", "execution": "1", "key": "order-1004"}`),
		chromedp.Click(chromedp.CSS("#review-complete")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-complete")),
		shot("complete"))
	if got := text("consequence", chromedp.CSS("#consequence")); !strings.Contains(got, "Every retry with this key gets this outcome") {
		t.Fatalf("the complete confirmation says %q, want its consequence", got)
	}
	if got := text("outcome", chromedp.CSS("#complete-outcome")); !strings.Contains(got, `"payload": "charged by the provider"`) {
		t.Fatalf("the complete confirmation shows the outcome %q", got)
	}
	if got := f.toolState(t, "order-1004"); got != "unknown" {
		t.Fatalf("order-1004 is %s before the confirmation, want unknown", got)
	}
	run("confirm it",
		chromedp.Click(chromedp.CSS("#confirm-complete")),
		chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := text("result", chromedp.CSS("#result")); !strings.HasPrefix(got, "Completed") {
		t.Fatalf("after complete the page says %q", got)
	}
	if resp, err := f.call(t, "order-1004", false); err != nil || resp.GetPayload() != "charged by the provider" || resp.GetExecution() != 1 {
		t.Fatalf("call order-1004 after its completion: %v, %v; want the completed outcome replayed", resp, err)
	}
	if got := f.tool.runsOf("order-1004"); got != 1 {
		t.Fatalf("order-1004 ran %d times after its completion and a call, want 1 (the lost run only)", got)
	}

	run("list the completed records",
		chromedp.Navigate(base+"/records?state=completed"),
		chromedp.WaitVisible(chromedp.CSS("#records")),
		shot("records"),
		chromedp.Click(`//table[@id="records"]//a[text()="order-1001"]`),
		chromedp.WaitVisible(chromedp.CSS("#forget")),
		chromedp.Click(chromedp.CSS("#forget")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-forget")),
		shot("forget"))
	if got := text("consequence", chromedp.CSS("#consequence")); !strings.Contains(got, "run the side effect AGAIN") {
		t.Fatalf("the forget confirmation says %q, want its consequence", got)
	}
	run("forget it",
		chromedp.Click(chromedp.CSS("#confirm-forget")),
		chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := text("result", chromedp.CSS("#result")); !strings.HasPrefix(got, "Forgot") {
		t.Fatalf("after forget the page says %q", got)
	}
	if _, err := f.call(t, "order-1001", false); err != nil {
		t.Fatalf("call order-1001 after it was forgotten: %v", err)
	}
	if got := f.tool.runsOf("order-1001"); got != 2 {
		t.Fatalf("order-1001 ran %d times after it was forgotten in the browser and called again, want 2", got)
	}
	if got, runs := f.toolState(t, "order-1002"), f.tool.runsOf("order-1002"); got != "completed" || runs != 1 {
		t.Fatalf("order-1002, not acted on, is %s after %d runs", got, runs)
	}
	run("the tenants page",
		chromedp.Navigate(base+"/tenants"),
		chromedp.WaitVisible(chromedp.CSS("#tenants")),
		shot("tenants"))
	if got := text("usage", chromedp.CSS("#tenants tbody")); !strings.Contains(got, "unauthenticated callers") || !strings.Contains(got, "40.0%") {
		t.Fatalf("the tenants page shows %q, want the unauthenticated callers' 4 records, 40.0%% of the quota of 10", got)
	}
	if got := text("refusals", chromedp.CSS("#quota-refusals")); !strings.Contains(got, "records") {
		t.Fatalf("the tenants page shows refusals %q, want the service's counters by quota", got)
	}
	// New keys past the caller's quota of toolMaxRecords records: the
	// last are refused, and the Activity page shows the refusals.
	for i := range toolMaxRecords {
		_, _ = f.call(t, fmt.Sprintf("order-2%03d", i), false)
	}
	// The gated calls above were timed by the service; one reading now
	// closes an interval that holds them, whatever the ticks did.
	console.SampleActivity(f.console)
	run("the activity page",
		chromedp.Navigate(base+"/activity"),
		chromedp.WaitVisible(chromedp.CSS("#chart-calls svg")),
		chromedp.WaitVisible(chromedp.CSS("#activity-numbers")),
		shot("activity"))
	if got := text("stages", chromedp.CSS("#activity-stages")); !strings.Contains(got, "Begin") || !strings.Contains(got, "statement") {
		t.Fatalf("the activity page's stage table shows %q, want Begin's statement stage", got)
	}
	if got := text("refusals", chromedp.CSS("#activity-numbers thead")); !strings.Contains(got, "quota records") {
		t.Fatalf("the activity page's table has columns %q, want the records quota's refusals", got)
	}
	if lines, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#chart-calls polyline, #chart-calls circle").length`)); err != nil || lines == 0 {
		t.Fatalf("the calls chart draws %d lines or points (%v), want its series drawn", lines, err)
	}
	for _, line := range []string{`"action":"resolve_release","namespace":"","scope":"` + toolScope + `","key":"order-1003"`,
		`"action":"resolve_complete","namespace":"","scope":"` + toolScope + `","key":"order-1004"`,
		`"action":"forget","namespace":"","scope":"` + toolScope + `","key":"order-1001"`} {
		if !strings.Contains(f.logs.String(), line) {
			t.Errorf("no audit line with %s:\n%s", line, f.logs)
		}
	}
}
