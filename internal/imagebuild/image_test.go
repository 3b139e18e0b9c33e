package main

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/gobuild"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// unavailable skips the test for a missing prerequisite, or fails it under
// CI=true: CI must not pass by skipping the image.
func unavailable(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func TestTag(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                 "v1.2.3",
		"43a55d3-dirty":          "43a55d3-dirty",
		"v1.0.0+meta/x":          "v1.0.0-meta-x",
		"":                       "devel",
		".hidden":                "hidden",
		strings.Repeat("a", 200): strings.Repeat("a", 128),
	} {
		if got := Tag(in); got != want {
			t.Errorf("Tag(%q) = %q, want %q", in, got, want)
		}
	}
}

// The image's binary is built with the flags every test's binaries share
// (internal/gobuild): a different set would compile every dependency again
// in make test (issue 32: 422 CPU-seconds).
func TestBinaryUsesTheSharedFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "dedupesvc")
	root, err := ModuleRoot(context.Background(), ".")
	if err != nil {
		t.Fatal(err)
	}
	if err := BuildBinary(context.Background(), root, runtime.GOARCH, bin); err != nil {
		t.Fatal(err)
	}
	if err := gobuild.Check(bin); err != nil {
		t.Fatal(err)
	}
}

func TestCreatedTime(t *testing.T) {
	commit := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if got, err := CreatedTime("", commit); err != nil || !got.Equal(commit) {
		t.Errorf("no SOURCE_DATE_EPOCH: %v, %v; want the commit time", got, err)
	}
	if got, err := CreatedTime("1700000000", commit); err != nil || got.Unix() != 1700000000 {
		t.Errorf("SOURCE_DATE_EPOCH=1700000000: %v, %v", got, err)
	}
	if _, err := CreatedTime("yesterday", commit); err == nil {
		t.Error("SOURCE_DATE_EPOCH=yesterday accepted")
	}
}

// TestImageRunsAgainstPostgreSQL builds the image as make image does, reads
// it back from the tarball, holds its configuration to what docs/service.md
// "Container image" says, unpacks its layer into a root file system and
// runs its entrypoint there as a runtime would (own mount and PID
// namespaces, /proc, chroot, the image's user, environment and working
// directory, nothing of the host's environment) against the local
// PostgreSQL, then sends a gated charge and its retry through it.
func TestImageRunsAgainstPostgreSQL(t *testing.T) {
	if os.Geteuid() != 0 {
		unavailable(t, "imagebuild: running the image's root file system needs root (chroot, namespaces, the image's uid 65532); run the tests as root, as CI does")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		unavailable(t, "imagebuild: running the image's root file system needs unshare (util-linux): "+err.Error())
	}
	if _, err := exec.LookPath("git"); err != nil {
		unavailable(t, "imagebuild: the image's labels and timestamps come from git: "+err.Error())
	}
	if _, err := os.Stat(CACertsPath); err != nil {
		unavailable(t, "imagebuild: the image copies this machine's CA certificates: "+err.Error())
	}
	// The database first: without PostgreSQL pgtest skips before the build.
	pool, schema := pgtest.EmptySchema(t)
	// Generous: on an empty build cache the build compiles every dependency
	// its binary shares with the other tests' (internal/gobuild), if no test
	// has yet (minutes on 2 cores); on a warm one the whole
	// test takes about 20 s.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	tarPath := filepath.Join(t.TempDir(), "dedupesvc-image.tar")
	built, err := Build(ctx, ".", runtime.GOARCH, CACertsPath, tarPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: %d bytes, %s", built.Tags[0], built.Size, built.Digest)

	// Read back what docker load would read. A docker archive keeps the
	// configuration and layers, not the manifest (a loader writes its own),
	// so the image ID, the configuration's digest, is what must survive.
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := img.ConfigName(); err != nil || id != built.ConfigDigest {
		t.Fatalf("tarball's image ID %v, %v; Build reported %s", id, err, built.ConfigDigest)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	vcs, err := ReadVCS(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	created, err := CreatedTime(os.Getenv("SOURCE_DATE_EPOCH"), vcs.Time)
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, cf, vcs, created)

	// Reproducible: the same inputs give the same image. (The binary is
	// reproducible by -trimpath; this holds the layer and config to it.)
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if err := unpack(layers, rootfs, created); err != nil {
		t.Fatal(err)
	}
	again, err := Image(Options{Binary: filepath.Join(rootfs, Entrypoint), CACerts: CACertsPath, Arch: runtime.GOARCH,
		Created: created, Version: vcs.Version, Revision: vcs.Revision})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := again.Digest(); err != nil || d != built.Digest {
		t.Fatalf("the same inputs built image %v, %v; the first was %s: not reproducible", d, err, built.Digest)
	}

	uid, gid := lookupUser(t, rootfs, cf.Config.User)
	if uid != UserID || gid != GroupID {
		t.Fatalf("user %q is uid %d gid %d in the image's /etc/passwd, want %d:%d", cf.Config.User, uid, gid, UserID, GroupID)
	}

	// docker run IMAGE migrate, with no DATABASE_URL: the embedded store is
	// created in the image's data directory, which the user may write.
	// migrate validates the serving flags too, so the image's 0.0.0.0
	// listen address would demand TLS and authentication of it; docs/service.md
	// "Container image" gives the loopback override used here.
	migrateCfg := cf.Config
	migrateCfg.Cmd = []string{"migrate"}
	m := run(t, unshare, rootfs, migrateCfg, uid, gid, append(slices.Clone(cf.Config.Env), "IDEMGATE_LISTEN=127.0.0.1:50051"))
	if err := m.wait(time.Minute); err != nil {
		t.Fatalf("migrate on the embedded store: %v\n%s", err, m.log())
	}
	if fi, err := os.Stat(filepath.Join(rootfs, DataDir, "dedupe.db")); err != nil {
		t.Fatalf("migrate made no embedded store: %v\n%s", err, m.log())
	} else if st := fi.Sys().(*syscall.Stat_t); st.Uid != uint32(uid) || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("%s/dedupe.db: owner %d, mode %v; want %d and private", DataDir, st.Uid, fi.Mode(), uid)
	}

	// What an operator adds with docker run: a token file mounted into the
	// container (owned by the image's user, mode 0600), the database, and
	// ports of their own (the test shares the host's network namespace,
	// where 50051 and 9464 may be taken, instead of publishing them).
	secret := rand.Text()
	tokenFile := "/run/idemgate/tokens"
	if err := os.MkdirAll(filepath.Join(rootfs, path.Dir(tokenFile)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, tokenFile), []byte("imagetest client "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(rootfs, tokenFile), uid, gid); err != nil {
		t.Fatal(err)
	}
	grpcPort, metricsPort := freePort(t), freePort(t)
	dbURL := pgtest.URL()
	if strings.Contains(dbURL, "?") {
		dbURL += "&search_path=" + schema
	} else {
		dbURL += "?search_path=" + schema
	}
	env := append(slices.Clone(cf.Config.Env),
		"DATABASE_URL="+dbURL,
		"IDEMGATE_TOKEN_FILE="+tokenFile,
		"IDEMGATE_INSECURE_PLAINTEXT=true",
		"IDEMGATE_LISTEN=0.0.0.0:"+strconv.Itoa(grpcPort),
		"IDEMGATE_METRICS_LISTEN=0.0.0.0:"+strconv.Itoa(metricsPort))
	c := run(t, unshare, rootfs, cf.Config, uid, gid, env)

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(auth.BearerToken(secret, true)),
		grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	healthCtx, healthCancel := context.WithTimeout(ctx, time.Minute)
	defer healthCancel()
	if h, err := healthpb.NewHealthClient(conn).Check(healthCtx, &healthpb.HealthCheckRequest{Service: "idemgate.v1.DedupeService"}, grpc.WaitForReady(true)); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v\n%s", h, err, c.log())
	}

	// The containerised process: PID 1 of its namespace, as the image's
	// user, with the unpacked root file system as its root.
	pid := c.containerPid(t)
	status := procStatus(t, pid)
	if want := fmt.Sprintf("%d\t%d\t%d\t%d", uid, uid, uid, uid); status["Uid"] != want {
		t.Errorf("Uid: %q, want %q", status["Uid"], want)
	}
	if want := fmt.Sprintf("%d\t%d\t%d\t%d", gid, gid, gid, gid); status["Gid"] != want {
		t.Errorf("Gid: %q, want %q", status["Gid"], want)
	}
	if status["Groups"] != "" {
		t.Errorf("supplementary groups %q, want none", status["Groups"])
	}
	if ns := strings.Fields(status["NSpid"]); len(ns) != 2 || ns[1] != "1" {
		t.Errorf("NSpid %q, want PID 1 in its own namespace", status["NSpid"])
	}
	if r, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || r != rootfs {
		t.Errorf("root %q, %v; want %s", r, err, rootfs)
	}

	// A gated charge and its retry: the handler runs once, the retry is
	// the stored outcome, kept in PostgreSQL by the containerised service.
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &payments.Ledger{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: ledger})
	client := paymentsv1.NewPaymentsServiceClient(stacktest.Serve(t, srv))
	keyed := metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "order-image-1")
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_22", AmountCents: 2200}
	first, err := client.ChargeCard(keyed, req)
	if err != nil {
		t.Fatalf("charge: %v\n%s", err, c.log())
	}
	var header metadata.MD
	second, err := client.ChargeCard(keyed, req, grpc.Header(&header))
	if err != nil || second.GetChargeId() != first.GetChargeId() || !interceptor.IsReplayed(header) || len(ledger.Charges()) != 1 {
		t.Fatalf("retry: %v, %v, header %v, %d charges; want the replay and one charge", second, err, header, len(ledger.Charges()))
	}
	var records int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idemgate_records").Scan(&records); err != nil || records != 1 {
		t.Fatalf("%d records in schema %s, %v; want the one the containerised service stored", records, schema, err)
	}

	// /metrics answers, process metrics (read from the container's /proc)
	// included.
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(metricsPort) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "process_resident_memory_bytes") {
		t.Errorf("/metrics: %s, want 200 with process metrics\n%.2000s", resp.Status, body)
	}

	// docker stop: SIGTERM to PID 1, which must stop cleanly.
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.wait(time.Minute); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit 0\n%s", err, c.log())
	}
}

// checkConfig holds the image's configuration to docs/service.md "Container image".
func checkConfig(t *testing.T, cf *v1.ConfigFile, vcs VCS, created time.Time) {
	t.Helper()
	c := cf.Config
	if c.User != "65532" {
		t.Errorf("User %q, want 65532", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/dedupesvc"}) || len(c.Cmd) != 0 {
		t.Errorf("Entrypoint %q Cmd %q, want [/dedupesvc] and no Cmd", c.Entrypoint, c.Cmd)
	}
	for _, want := range []string{"IDEMGATE_LISTEN=0.0.0.0:50051", "IDEMGATE_METRICS_LISTEN=0.0.0.0:9464", "IDEMGATE_DATA_DIR=/var/lib/idemgate"} {
		if !slices.Contains(c.Env, want) {
			t.Errorf("Env %q lacks %s", c.Env, want)
		}
	}
	if len(c.ExposedPorts) != 2 {
		t.Errorf("ExposedPorts %v, want 50051/tcp and 9464/tcp", c.ExposedPorts)
	}
	for _, p := range []string{"50051/tcp", "9464/tcp"} {
		if _, ok := c.ExposedPorts[p]; !ok {
			t.Errorf("ExposedPorts %v lack %s", c.ExposedPorts, p)
		}
	}
	for k, want := range map[string]string{
		LabelSource:   "https://github.com/idemgate/idemgate",
		LabelVersion:  vcs.Version,
		LabelRevision: vcs.Revision,
		LabelCreated:  created.Format(time.RFC3339),
	} {
		if got := c.Labels[k]; got != want || want == "" {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !cf.Created.Equal(created) {
		t.Errorf("Created %v, want %v (the commit's time or SOURCE_DATE_EPOCH)", cf.Created.Time, created)
	}
}

// unpack extracts layers into dir in order, as a runtime's snapshotter
// does: modes, numeric owners and modification times as the tar says. The
// image has one layer, so whiteouts, which only delete what a lower layer
// made, are refused rather than applied. It also checks that every entry's
// time is created.
func unpack(layers []v1.Layer, dir string, created time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// A runtime's root directory is 0755 root whatever made it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		err = unpackLayer(tar.NewReader(rc), dir, created)
		rc.Close()
		if err != nil {
			return err
		}
	}
	// The mount points a runtime adds.
	return os.MkdirAll(filepath.Join(dir, "proc"), 0o555)
}

func unpackLayer(tr *tar.Reader, dir string, created time.Time) error {
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("layer entry %q escapes the root", h.Name)
		}
		if strings.HasPrefix(path.Base(name), ".wh.") {
			return fmt.Errorf("layer entry %q is a whiteout; a single-layer image has nothing to delete", h.Name)
		}
		if !h.ModTime.Equal(created) {
			return fmt.Errorf("layer entry %q has time %v, want %v", h.Name, h.ModTime, created)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		mode := os.FileMode(h.Mode).Perm()
		if h.Mode&0o4000 != 0 {
			mode |= os.ModeSetuid
		}
		if h.Mode&0o2000 != 0 {
			mode |= os.ModeSetgid
		}
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{target, h.ModTime})
		case tar.TypeReg:
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("layer entry %q has type %q; the image holds directories and regular files only", h.Name, h.Typeflag)
		}
		if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
			return err
		}
		if err := os.Chmod(target, mode); err != nil { // after chown, which clears setuid
			return err
		}
		if err := os.Chtimes(target, h.ModTime, h.ModTime); err != nil {
			return err
		}
	}
	// A directory's time last, after its entries were made in it.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chtimes(dirs[i].path, dirs[i].t, dirs[i].t); err != nil {
			return err
		}
	}
	return nil
}

// lookupUser resolves an image's User as a runtime does: uid[:gid], a
// numeric uid taking its group from the image's /etc/passwd.
func lookupUser(t *testing.T, rootfs, user string) (uid, gid int) {
	t.Helper()
	u, g, hasGroup := strings.Cut(user, ":")
	uid, err := strconv.Atoi(u)
	if err != nil {
		t.Fatalf("User %q: want a numeric uid, as Kubernetes' runAsNonRoot needs", user)
	}
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil {
			t.Fatalf("User %q: want a numeric gid", user)
		}
		return uid, gid
	}
	f, err := os.Open(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[2] == u {
			if gid, err = strconv.Atoi(fields[3]); err != nil {
				t.Fatalf("/etc/passwd line %q: %v", sc.Text(), err)
			}
			return uid, gid
		}
	}
	t.Fatalf("uid %d is not in the image's /etc/passwd", uid)
	return 0, 0
}

// container is the image's entrypoint running under unshare.
type container struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// run starts the image's Entrypoint and Cmd in rootfs the way a runtime
// would, but without one: unshare makes new mount and PID namespaces
// (mounts private to them), forks, mounts /proc for the new PID namespace,
// chroots into rootfs, changes to the working directory, drops to uid:gid
// with no supplementary groups, and execs the entrypoint as PID 1 with
// env and nothing else. The network namespace is the host's.
func run(t *testing.T, unshare, rootfs string, cfg v1.Config, uid, gid int, env []string) *container {
	t.Helper()
	wd := cfg.WorkingDir
	if wd == "" {
		wd = "/"
	}
	args := []string{"--mount", "--pid", "--fork", "--kill-child", "--mount-proc=/proc",
		"--root=" + rootfs, "--wd=" + wd, "--setuid=" + strconv.Itoa(uid), "--setgid=" + strconv.Itoa(gid), "--"}
	args = append(args, cfg.Entrypoint...)
	args = append(args, cfg.Cmd...)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "container.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(unshare, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &container{cmd: cmd, logPath: logFile.Name(), done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
		if t.Failed() {
			t.Logf("container log:\n%s", c.log())
		}
	})
	return c
}

func (c *container) log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

// containerPid is the host's id of the entrypoint: unshare's only child.
func (c *container) containerPid(t *testing.T) int {
	t.Helper()
	p := c.cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p, p))
	if err != nil {
		t.Fatal(err)
	}
	kids := strings.Fields(string(b))
	if len(kids) != 1 {
		t.Fatalf("unshare (pid %d) has children %q, want one", p, kids)
	}
	pid, err := strconv.Atoi(kids[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// wait waits for unshare, which exits with its child's status.
func (c *container) wait(timeout time.Duration) error {
	select {
	case <-c.done:
		return c.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %s", timeout)
	}
}

// procStatus reads /proc/pid/status as field: value.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func freePort(t *testing.T) int {
	t.Helper()
	lis, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}
