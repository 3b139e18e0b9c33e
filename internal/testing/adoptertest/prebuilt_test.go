package adoptertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A tools directory's binary stands in for the guide's go install line only
// when it is that line's binary: another package or version, or a binary
// built otherwise (this test binary: -race, cgo, another path), is refused
// and the line runs as written.
func TestPrebuiltIsOnlyTheLinesOwnBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	put := func(name, version string) {
		p := filepath.Join(dir, name+"-"+version, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	put("buf", "v1.75.0")
	if got, err := prebuilt(dir, "github.com/bufbuild/buf/cmd/buf", "v1.75.0"); got != "" || err == nil {
		t.Errorf("prebuilt took a binary of another package: %q", got)
	}
	if got, err := prebuilt(dir, "github.com/bufbuild/buf/cmd/buf", "v1.76.0"); got != "" || err == nil {
		t.Errorf("prebuilt took a missing version: %q", got)
	}
	if got, err := prebuilt("", "github.com/bufbuild/buf/cmd/buf", "v1.75.0"); got != "" || err == nil {
		t.Errorf("prebuilt found a binary without a tools directory: %q", got)
	}
}

// The guide's plugin install lines are what buildScript serves from the
// tools directory: if the guide spelled them otherwise, nothing would match
// and every run would compile them again, unnoticed. (buf comes from npm.)
func TestGuideInstallLinesAreRecognised(t *testing.T) {
	var found []string
	for _, b := range readGuide(t) {
		if b.kind != runBlock {
			continue
		}
		for _, m := range goInstallLine.FindAllStringSubmatch(b.body, -1) {
			found = append(found, m[1])
		}
	}
	for _, want := range []string{"google.golang.org/protobuf/cmd/protoc-gen-go", "google.golang.org/grpc/cmd/protoc-gen-go-grpc"} {
		if !strings.Contains(strings.Join(found, " "), want) {
			t.Errorf("no guide line `GOBIN=$PWD/bin go install %s@...` (found %q)", want, found)
		}
	}
}
