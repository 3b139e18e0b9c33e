package adoptertest

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/gobuild"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

// python is Debian's interpreter, the one python3-grpcio installs for, and
// the one the guide runs.
const python = "/usr/bin/python3"

// guideVars are the variables of the guide's env block, which the test sets
// itself.
var guideVars = []string{"IDEMGATE", "DATABASE_URL", "DEDUPE_ADDR", "DEDUPE_METRICS", "MAILER_ADDR", "MAILER_METRICS"}

// runTimeout bounds the whole run, far above the seconds it takes, so that a
// hung step fails the test instead of the test binary's timeout; it is no
// timing assertion.
const runTimeout = 20 * time.Minute

// repoRoot is the clone the test runs from: the guide's $IDEMGATE.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func readGuide(t *testing.T) []block {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "adopting.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseGuide(string(b))
	if err != nil {
		t.Fatalf("docs/adopting.md: %v", err)
	}
	return blocks
}

// need skips the test when something the guide uses is missing, and fails
// it under CI=true, where .ci/run must have installed it.
func need(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing (CI=true, so this fails): %v", what, err)
	}
	t.Skipf("%s is missing: %v", what, err)
}

// The guide installs buf and the plugins at the versions the Makefile pins,
// and says protoc-gen-go is the protobuf runtime's version in go.mod.
func TestGuidePinsAreTheMakefiles(t *testing.T) {
	root := repoRoot(t)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	pin := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(\S+)`).FindSubmatch(makefile)
		if m == nil {
			t.Fatalf("Makefile: no %s", name)
		}
		return string(m[1])
	}
	// The lines run, and the shown ones: buf built from source is the
	// alternative for a machine without npm, pinned all the same.
	var run, shown []string
	installLine := regexp.MustCompile(`go install (\S+)|npm install .*?(@bufbuild/buf@\S+)`)
	for _, b := range readGuide(t) {
		for _, m := range installLine.FindAllStringSubmatch(b.body, -1) {
			line := m[0]
			if m[2] != "" {
				line = "npm install " + m[2]
			}
			switch b.kind {
			case runBlock:
				run = append(run, line)
			case shownBlock:
				shown = append(shown, line)
			}
		}
	}
	for _, want := range []string{
		"npm install @bufbuild/buf@" + strings.TrimPrefix(pin("BUF_VERSION"), "v"),
		"go install google.golang.org/protobuf/cmd/protoc-gen-go@" + pin("PROTOC_GEN_GO_VERSION"),
		"go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@" + pin("PROTOC_GEN_GO_GRPC_VERSION"),
	} {
		if !slices.Contains(run, want) {
			t.Errorf("docs/adopting.md does not run %q (the Makefile's pin); it runs %q", want, run)
		}
	}
	if want := "go install github.com/bufbuild/buf/cmd/buf@" + pin("BUF_VERSION"); !slices.Contains(shown, want) {
		t.Errorf("docs/adopting.md does not show %q (the Makefile's pin) for a machine without npm; it shows %q", want, shown)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s*google.golang.org/protobuf ` + regexp.QuoteMeta(pin("PROTOC_GEN_GO_VERSION")) + `$`).Match(gomod) {
		t.Errorf("go.mod's google.golang.org/protobuf is not PROTOC_GEN_GO_VERSION %s: the guide says they are one", pin("PROTOC_GEN_GO_VERSION"))
	}
}

// guideFlag runs TestAdoptingGuide (make adopter, which CI runs after make
// test): it builds a whole second project from the module proxy and npm, so
// it stays out of a cold make test (issue 41: under 600 CPU-seconds).
var guideFlag = flag.Bool("adopter", false, "run docs/adopting.md end to end (make adopter)")

// TestAdoptingGuide runs docs/adopting.md as written in a directory outside
// the repository and checks what it printed: one execution and one replay.
func TestAdoptingGuide(t *testing.T) {
	if !*guideFlag {
		t.Skip("the adopter's guide runs end to end with -adopter: make adopter (CI runs it after make test)")
	}
	blocks := readGuide(t)
	root := repoRoot(t)

	_, err := exec.LookPath("curl")
	need(t, "curl", err)
	// Step 2 installs buf's prebuilt binary with npm; its launcher runs on node.
	_, err = exec.LookPath("npm")
	need(t, "npm", err)
	_, err = exec.LookPath("node")
	need(t, "node", err)
	need(t, "bash", func() error { _, err := exec.LookPath("bash"); return err }())
	pythonErr := exec.Command(python, "-c", "import grpc, google.protobuf").Run()
	if pythonErr != nil && os.Getenv("CI") == "true" {
		t.Fatalf("%s with grpcio and protobuf is missing (CI=true, so this fails; .ci/run installs python3-grpcio and python3-protobuf): %v", python, pythonErr)
	}

	// A database of the test's own on the shared server, which the guide's
	// create-database step creates; dropped when the test ends.
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.URL())
	need(t, "PostgreSQL at "+pgtest.URL(), err)
	admin.Close(ctx)
	dbName := fmt.Sprintf("adoptertest_%d_%d", os.Getpid(), time.Now().UnixNano())
	pgtest.DropDatabase(t, dbName)
	dbURL, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Path = "/" + dbName

	vars := map[string]string{"IDEMGATE": root, "DATABASE_URL": dbURL.String()}
	taken := map[string]bool{}
	for _, name := range []string{"DEDUPE_ADDR", "DEDUPE_METRICS", "MAILER_ADDR", "MAILER_METRICS"} {
		addr := stacktest.FreeAddr(t)
		for taken[addr] { // a port handed out twice
			addr = stacktest.FreeAddr(t)
		}
		taken[addr], vars[name] = true, addr
	}

	base := t.TempDir() // outside the repository: the guide starts from nothing
	work := filepath.Join(base, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	script, ran, outputs, pythonRan := buildScript(t, blocks, vars, work, pythonErr == nil)
	scriptPath := filepath.Join(base, "guide.sh")
	if err := os.WriteFile(scriptPath, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, err := runScript(t, base, scriptPath)
	// The guide's directory: the one its first block makes and enters.
	dir := guideDir(work)
	if err != nil {
		failed := lastMarker(stdout)
		msg := fmt.Sprintf("the guide failed (%v)", err)
		if failed >= 0 {
			msg += fmt.Sprintf(" in its sh block at docs/adopting.md line %d:\n%s", blocks[failed].line, blocks[failed].body)
		}
		t.Errorf("%s\nstdout:\n%s\nstderr:\n%s", msg, tail(stdout), tail(stderr))
		logFiles(t, dir)
		return
	}

	printed := splitByBlock(stdout)
	for _, o := range outputs {
		got, want := outputLines(printed[o.of]), outputLines(o.body)
		if !slices.Equal(got, want) {
			t.Errorf("docs/adopting.md line %d: the sh block at line %d printed\n%s\nwant (the output block at line %d)\n%s",
				blocks[o.of].line, blocks[o.of].line, strings.Join(got, "\n"), o.line, strings.Join(want, "\n"))
		}
	}
	if len(ran) == 0 || len(outputs) == 0 {
		t.Fatalf("%d sh blocks run, %d outputs compared: the extraction is broken", len(ran), len(outputs))
	}

	// What the guide promises, checked here whatever its output blocks say:
	// a call answered, then the same key replayed with the same message, and
	// the side effect once per key.
	m := regexp.MustCompile(`(?m)^message_id=(\S+) replayed=false .*\nmessage_id=(\S+) replayed=true `).FindStringSubmatch(stdout)
	if m == nil || m[1] != m[2] {
		t.Errorf("the guide's output has no call followed by its replay with the same message id:\n%s", stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "gen", "idemgate")); !os.IsNotExist(err) {
		t.Errorf("gen/idemgate exists in the guide's directory (%v): buf generated idemgate's own protos again", err)
	}
	serverLog, err := os.ReadFile(filepath.Join(dir, "mailer.log"))
	if err != nil {
		t.Fatal(err)
	}
	wantEffects := 1 // signup-42
	if pythonRan {
		wantEffects++ // signup-43
	}
	if n := strings.Count(string(serverLog), "side effect:"); n != wantEffects {
		t.Errorf("mailer.log has %d side effects, want %d (one per key):\n%s", n, wantEffects, serverLog)
	}
	// Step 7: the Dedupe service inside the tool server, on the database of
	// step 5, with dedupesvc stopped.
	oneboxLog, err := os.ReadFile(filepath.Join(dir, "onebox.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(oneboxLog), "side effect:"); n != 1 || !strings.Contains(string(oneboxLog), "using PostgreSQL") {
		t.Errorf("onebox.log has %d side effects, want 1, from a server running the Dedupe service on PostgreSQL itself:\n%s", n, oneboxLog)
	}
	// The server of step 4 talks to a Dedupe service over the network: it
	// links none of the service's store drivers or exporters; step 7's, built
	// with the inprocess tag, links the service.
	for _, c := range []struct {
		bin  string
		want bool
	}{{"server", false}, {"server-onebox", true}} {
		if fi, err := os.Stat(filepath.Join(dir, "bin", c.bin)); err == nil {
			t.Logf("bin/%s: %.1f MB", c.bin, float64(fi.Size())/1e6)
		}
		mods, err := exec.Command("go", "version", "-m", filepath.Join(dir, "bin", c.bin)).CombinedOutput()
		if err != nil {
			t.Errorf("go version -m bin/%s: %v\n%s", c.bin, err, mods)
			continue
		}
		for _, m := range []string{"modernc.org/sqlite", "github.com/jackc/pgx/v5", "go.opentelemetry.io/otel/exporters/otlp"} {
			if linked := strings.Contains(string(mods), "\tdep\t"+m); linked != c.want {
				t.Errorf("bin/%s links %s: %v, want %v", c.bin, m, linked, c.want)
			}
		}
	}
	if !pythonRan {
		t.Skipf("every other step passed; the Python caller's step was not run: %s with grpcio and protobuf is missing (%v): apt-get install python3-grpcio python3-protobuf", python, pythonErr)
	}
}

// marker starts the stdout of the run block with index i.
func marker(i int) string { return fmt.Sprintf("@@adoptertest block %d@@", i) }

var markerLine = regexp.MustCompile(`(?m)^@@adoptertest block (\d+)@@$`)

// buildScript returns the bash script that runs the guide in work: the env
// block replaced by vars, each file block written where it stands, each run
// block after a marker on stdout and stderr. It returns the indexes of the
// run blocks, the output blocks, and whether the Python step runs.
func buildScript(t *testing.T, blocks []block, vars map[string]string, work string, havePython bool) (string, []int, []block, bool) {
	t.Helper()
	var s strings.Builder
	s.WriteString("set -euo pipefail\ncd " + shellQuote(work) + "\n")
	var ran []int
	var outputs []block
	sawEnv, pythonRan := false, false
	skipped := map[int]bool{}
	for i, b := range blocks {
		switch b.kind {
		case envBlock:
			names, err := envVars(b)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(guideVars))) {
				t.Fatalf("docs/adopting.md line %d: the env block sets %v; the test sets %v (change both together)", b.line, names, guideVars)
			}
			sawEnv = true
			for _, name := range guideVars {
				s.WriteString("export " + name + "=" + shellQuote(vars[name]) + "\n")
			}
		case fileBlock:
			// A heredoc with a quoted delimiter writes the text as it is.
			delim := "ADOPTERTEST_EOF_" + strconv.Itoa(i)
			if strings.Contains(b.body, delim) {
				t.Fatalf("line %d: the file block contains %s", b.line, delim)
			}
			fmt.Fprintf(&s, "mkdir -p \"$(dirname %s)\"\ncat > %s <<'%s'\n%s%s\n", shellQuote(b.path), shellQuote(b.path), delim, b.body, delim)
		case runBlock:
			if !sawEnv {
				t.Fatalf("docs/adopting.md line %d: an sh block before the env block", b.line)
			}
			fmt.Fprintf(&s, "printf '\\n%s\\n'; printf '\\n%s\\n' >&2\n", marker(i), marker(i))
			if b.needs == "python3-grpcio" && !havePython {
				skipped[i] = true
				s.WriteString(": skipped, no python3-grpcio\n")
				continue
			}
			if b.needs == "python3-grpcio" {
				pythonRan = true
			}
			ran = append(ran, i)
			s.WriteString(servePrebuilt(t, b.body))
		case outputBlock:
			if !skipped[b.of] {
				outputs = append(outputs, b)
			}
		}
	}
	if !sawEnv {
		t.Fatal("docs/adopting.md has no env block")
	}
	return s.String(), ran, outputs, pythonRan
}

// servePrebuilt replaces each go install line of body whose binary make
// tools has already built (prebuilt) by a copy of that binary into the
// line's GOBIN, and logs which lines it served and why it did not serve the
// others, which run as written.
func servePrebuilt(t *testing.T, body string) string {
	t.Helper()
	return goInstallLine.ReplaceAllStringFunc(body, func(line string) string {
		m := goInstallLine.FindStringSubmatch(line)
		bin, err := prebuilt(toolsDir(), m[1], m[2])
		if err != nil {
			t.Logf("runs %q as written: no prebuilt binary (%v)", line, err)
			return line
		}
		t.Logf("serves %q from make tools' %s: the same package, version, toolchain and flags", line, bin)
		return fmt.Sprintf("mkdir -p bin && cp %s bin/%s  # adoptertest: %s", shellQuote(bin), filepath.Base(bin), line)
	})
}

// runScript runs the script with bash in dir, in a process group of its own
// that is killed when it ends (the guide's servers run in the background),
// with the environment of a newcomer's shell: none of idemgate's variables.
func runScript(t *testing.T, dir, script string) (stdout, stderr string, err error) {
	t.Helper()
	timeout := runTimeout
	if d, ok := t.Deadline(); ok && time.Until(d)-30*time.Second < timeout {
		timeout = time.Until(d) - 30*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	outFile, errFile := filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")
	out, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	errOut, err := os.Create(errFile)
	if err != nil {
		t.Fatal(err)
	}
	defer errOut.Close()

	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, errOut
	// The guide's go build and go install lines build with the flags the
	// other tests' binaries share, so that they compile no dependency those
	// compiled (a newcomer's defaults would compile each once more).
	env, err := gobuild.Environ(newcomerEnv())
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(env, "BUF_CACHE_DIR="+filepath.Join(dir, "buf-cache"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("the guide ran in %s", time.Since(start).Round(time.Second))
	if cmd.Process != nil {
		// Whatever it left running (a server of a step that failed): its
		// group, which only this script's processes are in.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() != nil {
		runErr = fmt.Errorf("%w: not done within %s", runErr, timeout)
	}
	o, _ := os.ReadFile(outFile)
	e, _ := os.ReadFile(errFile)
	return string(o), string(e), runErr
}

// newcomerEnv is this process's environment without the variables that
// idemgate's commands read (IDEMGATE_*, DATABASE_URL, ...), which a
// newcomer's shell would not have set.
func newcomerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "IDEMGATE") || strings.HasPrefix(name, "PAYMENTS_") || name == "DATABASE_URL" ||
			name == "OTEL_EXPORTER_OTLP_ENDPOINT" || slices.Contains(guideVars, name) {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// splitByBlock maps each run block's index to what it printed on stdout.
func splitByBlock(stdout string) map[int]string {
	printed := map[int]string{}
	locs := markerLine.FindAllStringSubmatchIndex(stdout, -1)
	for j, loc := range locs {
		i, _ := strconv.Atoi(stdout[loc[2]:loc[3]])
		end := len(stdout)
		if j+1 < len(locs) {
			end = locs[j+1][0]
		}
		printed[i] = stdout[loc[1]:end]
	}
	return printed
}

// lastMarker is the index of the last run block that started, -1 for none.
func lastMarker(stdout string) int {
	all := markerLine.FindAllStringSubmatch(stdout, -1)
	if len(all) == 0 {
		return -1
	}
	i, _ := strconv.Atoi(all[len(all)-1][1])
	return i
}

// guideDir is the directory the guide's first block made in work, or work.
func guideDir(work string) string {
	entries, err := os.ReadDir(work)
	if err == nil && len(entries) == 1 && entries[0].IsDir() {
		return filepath.Join(work, entries[0].Name())
	}
	return work
}

// logFiles logs the servers' logs the guide wrote, for a failure.
func logFiles(t *testing.T, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, path := range logs {
		b, _ := os.ReadFile(path)
		t.Logf("%s:\n%s", filepath.Base(path), tail(string(b)))
	}
}

// tail is the end of a long text.
func tail(s string) string {
	const max = 8000
	if len(s) > max {
		return "...\n" + s[len(s)-max:]
	}
	return s
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
