// Command imagebuild builds the dedupesvc container image without a
// container engine or network: a static dedupesvc (CGO_ENABLED=0) on an
// empty base, with CA certificates, /etc/passwd naming the non-root user
// 65532, and /tmp, as one layer. It writes the image as a docker-archive
// tarball, which docker load and podman load read, and loads it nowhere.
//
//	go run ./internal/imagebuild -o bin/dedupesvc-image.tar   (make image)
//
// The image is reproducible: the binary is built with -trimpath, and every
// timestamp in the image is the commit's time (SOURCE_DATE_EPOCH overrides
// it), so the same commit, toolchain and CA bundle give the same digest.
// The labels name the source repository, the version (git describe) and
// the commit. docs/service.md "Container image" documents the configuration.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	out := flag.String("o", "bin/dedupesvc-image.tar", "docker-archive `file` to write")
	goarch := flag.String("goarch", runtime.GOARCH, "architecture of the binary and the image")
	caCerts := flag.String("ca-certs", CACertsPath, "PEM `file` of the CA certificates copied into the image")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("imagebuild: ")
	if flag.NArg() > 0 {
		log.Fatalf("unexpected argument %q", flag.Arg(0))
	}
	ctx := context.Background()
	res, err := Build(ctx, ".", *goarch, *caCerts, *out)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("imagebuild: wrote %s (%d bytes): %s, image ID %s\n", *out, res.Size, res.Tags[0], res.ConfigDigest)
	fmt.Printf("imagebuild: docker load -i %s (or podman load -i %s), then docker run %s\n", *out, *out, res.Tags[0])
}

// Result is what Build wrote.
type Result struct {
	// Image is the image written.
	Image v1.Image
	// Tags are the names it carries in the tarball, the version's first.
	Tags []string
	// Digest is the manifest's digest. ConfigDigest is the
	// configuration's, the image ID docker images shows after docker load:
	// a docker archive keeps no manifest, so a loader or pusher writes its
	// own and only ConfigDigest identifies the image across them.
	Digest, ConfigDigest v1.Hash
	// Size is the tarball's size in bytes.
	Size int64
}

// Build builds dedupesvc from the module containing dir, assembles the
// image (Image) and writes it to out as a docker-archive tarball, through
// a temporary file renamed into place.
func Build(ctx context.Context, dir, goarch, caCerts, out string) (Result, error) {
	root, err := ModuleRoot(ctx, dir)
	if err != nil {
		return Result{}, err
	}
	vcs, err := ReadVCS(ctx, root)
	if err != nil {
		return Result{}, fmt.Errorf("the labels and timestamps come from git: %w", err)
	}
	created, err := CreatedTime(os.Getenv("SOURCE_DATE_EPOCH"), vcs.Time)
	if err != nil {
		return Result{}, err
	}
	tmp, err := os.MkdirTemp("", "imagebuild-*")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "dedupesvc")
	if err := BuildBinary(ctx, root, goarch, bin); err != nil {
		return Result{}, err
	}
	img, err := Image(Options{Binary: bin, CACerts: caCerts, Arch: goarch, Created: created, Version: vcs.Version, Revision: vcs.Revision})
	if err != nil {
		return Result{}, err
	}
	return Write(img, Tag(vcs.Version), out)
}

// Write writes img to out as a docker-archive tarball tagged
// Repository:tag and Repository:latest.
func Write(img v1.Image, tag, out string) (Result, error) {
	res := Result{Image: img, Tags: []string{Repository + ":" + tag, Repository + ":latest"}}
	refs := map[name.Reference]v1.Image{}
	for _, t := range res.Tags {
		ref, err := name.NewTag(t)
		if err != nil {
			return Result{}, err
		}
		refs[ref] = img
	}
	var err error
	if res.Digest, err = img.Digest(); err != nil {
		return Result{}, err
	}
	if res.ConfigDigest, err = img.ConfigName(); err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return Result{}, err
	}
	partial := out + ".partial-" + fmt.Sprint(time.Now().UnixNano())
	if err := tarball.MultiRefWriteToFile(partial, refs); err != nil {
		os.Remove(partial)
		return Result{}, err
	}
	if err := os.Rename(partial, out); err != nil {
		os.Remove(partial)
		return Result{}, err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return Result{}, err
	}
	res.Size = fi.Size()
	return res, nil
}
