package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/idemgate/idemgate/internal/gobuild"
)

// What the image's configuration promises; docs/service.md "Container image"
// documents each, and the test holds the built image to them.
const (
	// User is the image's user: the non-root uid 65532 ("nonroot", group
	// 65532 in the image's /etc/passwd and /etc/group), as distroless uses.
	User = "65532"
	// UserID and GroupID are User's uid and gid.
	UserID, GroupID = 65532, 65532
	// Entrypoint is the path of the binary in the image.
	Entrypoint = "/dedupesvc"
	// GRPCPort and MetricsPort are the ports the image's environment makes
	// dedupesvc listen on, on every address (0.0.0.0).
	GRPCPort, MetricsPort = 50051, 9464
	// DataDir is the embedded store's directory in the image (owned by
	// User, mode 0700), used when DATABASE_URL is not set.
	DataDir = "/var/lib/idemgate"
	// CACertsPath is where the image holds the CA certificates Go's
	// crypto/x509 reads on Linux.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// Source is the org.opencontainers.image.source label.
	Source = "https://github.com/idemgate/idemgate"
	// Repository is the name the image is tagged with in the tarball.
	Repository = "idemgate/dedupesvc"
)

// The OCI annotation keys the image's labels use.
const (
	LabelSource   = "org.opencontainers.image.source"
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelCreated  = "org.opencontainers.image.created"
	LabelTitle    = "org.opencontainers.image.title"
)

// Env is the image's environment: dedupesvc reads each flag from its
// variable, so these are the container's default flags, and they survive
// arguments given to docker run (which replace Cmd, not Env). A flag given
// as an argument, or -e VAR=..., overrides them.
var Env = []string{
	"IDEMGATE_LISTEN=0.0.0.0:" + strconv.Itoa(GRPCPort),
	"IDEMGATE_METRICS_LISTEN=0.0.0.0:" + strconv.Itoa(MetricsPort),
	"IDEMGATE_DATA_DIR=" + DataDir,
}

// Options are the inputs of one image: the same Options give the same
// image, byte for byte.
type Options struct {
	// Binary is the path of a statically linked dedupesvc (BuildBinary).
	Binary string
	// CACerts is the path of the PEM bundle copied to CACertsPath.
	CACerts string
	// Arch is the binary's GOARCH, the image's architecture.
	Arch string
	// Created is the image's creation time and every file's modification
	// time: the commit's time, or SOURCE_DATE_EPOCH.
	Created time.Time
	// Version and Revision are the version and commit labels; an empty
	// one is left out.
	Version, Revision string
}

// VCS is what the source tree's git says about the commit the image is
// built from.
type VCS struct {
	// Version is git describe --tags --always --dirty: a tag, else the
	// short commit hash, with -dirty for uncommitted changes.
	Version string
	// Revision is the full commit hash.
	Revision string
	// Time is the commit's committer time.
	Time time.Time
}

// ReadVCS asks git about the checkout at dir. go build cannot stamp this
// into the binary from a git worktree (the go command takes only a .git
// directory for a repository), so the labels come from git itself.
func ReadVCS(ctx context.Context, dir string) (VCS, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var v VCS
	var err error
	if v.Revision, err = git("rev-parse", "HEAD"); err != nil {
		return VCS{}, err
	}
	if v.Version, err = git("describe", "--tags", "--always", "--dirty"); err != nil {
		return VCS{}, err
	}
	ct, err := git("log", "-1", "--format=%ct", "HEAD")
	if err != nil {
		return VCS{}, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return VCS{}, fmt.Errorf("commit time %q: %w", ct, err)
	}
	v.Time = time.Unix(sec, 0).UTC()
	return v, nil
}

// CreatedTime is SOURCE_DATE_EPOCH (seconds) when sourceDateEpoch is set,
// else fallback.
func CreatedTime(sourceDateEpoch string, fallback time.Time) (time.Time, error) {
	if sourceDateEpoch == "" {
		return fallback.UTC(), nil
	}
	sec, err := strconv.ParseInt(sourceDateEpoch, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", sourceDateEpoch)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// ModuleRoot returns the directory of the main module's go.mod, as the go
// command run in dir finds it.
func ModuleRoot(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}

// BuildBinary builds cmd/dedupesvc of the module at moduleDir into out for
// linux/goarch with internal/gobuild's flags, which every binary a test
// builds shares: statically (CGO_ENABLED=0; the embedded store's
// modernc.org/sqlite is pure Go), -trimpath so the binary holds no path of
// this machine; and stripped of its symbol table and DWARF (-s -w; panics
// still print symbolised stacks).
func BuildBinary(ctx context.Context, moduleDir, goarch, out string) error {
	unlock, err := gobuild.Lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cmd := gobuild.Command(ctx, moduleDir, "-s -w", "-o", out, "./cmd/dedupesvc")
	cmd.Env = append(cmd.Env, "GOOS=linux", "GOARCH="+goarch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/dedupesvc: %v\n%s", err, b)
	}
	return nil
}

// file is one entry of the image's single layer.
type file struct {
	name     string // without a leading /; a directory's ends in /
	mode     int64  // permission bits, with setuid, setgid and sticky
	uid, gid int
	data     []byte // a regular file's contents
}

// passwd and group name root and the image's non-root user; nothing logs in.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group  = "root:x:0:\nnonroot:x:65532:\n"
)

// Layer returns the image's only layer, as an uncompressed tar: the
// directories, /etc/passwd and /etc/group, the CA certificates, /tmp and
// the binary, every entry with modification time created and numeric
// owners only, in a fixed order.
func Layer(binary, caCerts []byte, created time.Time) ([]byte, error) {
	files := []file{
		{name: "dedupesvc", mode: 0o755, data: binary},
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: strings.TrimPrefix(CACertsPath, "/"), mode: 0o644, data: caCerts},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: UserID, gid: GroupID},
		{name: "root/", mode: 0o700},
		{name: "tmp/", mode: 0o1777},
		{name: "var/", mode: 0o755},
		{name: "var/lib/", mode: 0o755},
		{name: strings.TrimPrefix(DataDir, "/") + "/", mode: 0o700, uid: UserID, gid: GroupID},
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: created,
			Format:  tar.FormatPAX,
		}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Image assembles the image from opts: OCI media types, one layer, and the
// configuration docs/service.md "Container image" describes.
func Image(opts Options) (v1.Image, error) {
	binary, err := os.ReadFile(opts.Binary)
	if err != nil {
		return nil, err
	}
	caCerts, err := os.ReadFile(opts.CACerts)
	if err != nil {
		return nil, fmt.Errorf("CA certificates: %w", err)
	}
	layerTar, err := Layer(binary, caCerts, opts.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: opts.Created}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   created,
			CreatedBy: "go run ./internal/imagebuild (dedupesvc " + opts.Version + ")",
			Comment:   "dedupesvc, CA certificates, /etc/passwd, /tmp",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS = "linux"
	cf.Architecture = opts.Arch
	labels := map[string]string{
		LabelSource:  Source,
		LabelCreated: opts.Created.Format(time.RFC3339),
		LabelTitle:   "dedupesvc",
	}
	if opts.Version != "" {
		labels[LabelVersion] = opts.Version
	}
	if opts.Revision != "" {
		labels[LabelRevision] = opts.Revision
	}
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{Entrypoint},
		Env:        append([]string(nil), Env...),
		WorkingDir: "/",
		ExposedPorts: map[string]struct{}{
			strconv.Itoa(GRPCPort) + "/tcp":    {},
			strconv.Itoa(MetricsPort) + "/tcp": {},
		},
		Labels:     labels,
		StopSignal: "SIGTERM",
	}
	return mutate.ConfigFile(img, cf)
}

// tagChars are what a tag may hold besides letters and digits.
var notTagChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// Tag turns a version into an image tag: characters a tag may not hold
// become '-', and it is cut to 128 characters; empty is "devel".
func Tag(version string) string {
	t := notTagChars.ReplaceAllString(version, "-")
	t = strings.TrimLeft(t, ".-")
	if len(t) > 128 {
		t = t[:128]
	}
	if t == "" {
		return "devel"
	}
	return t
}
