package embedded

import (
	"os"
	"reflect"
	"testing"

	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// A Config that sets only its store (dedupesvc's default data directory,
// as dedupesvc without flags opens it) is dedupesvc run without flags (its
// metrics endpoint aside), and ParseFlags without flags gives the same
// service: the one source of the defaults is dedupesvc's flags.
func TestZeroConfigIsDedupesvcsDefaults(t *testing.T) {
	want := dedupeapp.Defaults(os.Getenv)
	want.MetricsListen = ""
	got := Config{DataDir: want.DataDir}.app().WithNames(nil)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Config{DataDir} runs\n%+v\nwant dedupesvc's defaults\n%+v", got, want)
	}
	parsed := fromApp(dedupeapp.Defaults(os.Getenv))
	parsed.MetricsListen = ""
	if got := parsed.app().WithNames(nil); !reflect.DeepEqual(got, want) {
		t.Errorf("ParseFlags' defaults run\n%+v\nwant\n%+v", got, want)
	}
}
