package protoset

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoregistry"
)

// ExcludedSources are the directories under proto/ that ExportSources
// leaves out: the test services, which no caller calls.
var ExcludedSources = []string{"idemgate/testing/"}

// ExportSources copies the .proto files under src (the repository's proto/)
// into dst with their paths relative to src, the import paths buf and protoc
// resolve, leaving out ExcludedSources; it returns those paths, sorted. This
// is what buf export wrote, without building buf. Each file must be linked
// into files (from gen/), so the sources are the ones gen/ and the
// descriptor set were made from: make lint checks gen/ against them.
func ExportSources(files *protoregistry.Files, src, dst string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".proto") {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		for _, ex := range ExcludedSources {
			if strings.HasPrefix(rel, ex) {
				return nil
			}
		}
		if _, err := files.FindFileByPath(rel); err != nil {
			return fmt.Errorf("protoset: %s is not linked into this binary (import its gen/ package): %w", rel, err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(out, b, 0o644); err != nil {
			return err
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("protoset: no .proto file under %s", src)
	}
	sort.Strings(paths)
	return paths, nil
}
