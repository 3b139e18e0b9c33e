package httpgate_test

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/httpgate"
)

// curl posts body with curl and returns the raw response head and body
// bytes as curl wrote them.
func curl(t *testing.T, url string, args ...string) (head string, body []byte) {
	t.Helper()
	path, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl is not installed")
		}
		t.Skip("curl is not installed (apt-get install curl)")
	}
	dir := t.TempDir()
	headFile, bodyFile := filepath.Join(dir, "head"), filepath.Join(dir, "body")
	cmd := exec.Command(path, append([]string{"-sS", "--max-time", "60", "-D", headFile, "-o", bodyFile, url}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("curl: %v: %s", err, out)
	}
	h, err := os.ReadFile(headFile)
	if err != nil {
		t.Fatal(err)
	}
	body, err = os.ReadFile(bodyFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(h), body
}

// headerOf returns the value of a field in a raw response head.
func headerOf(head, name string) string {
	for _, line := range strings.Split(head, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestCurlGetsTheSameBytesAsGo(t *testing.T) {
	f := setup(t, dedupe(t))
	args := []string{"-X", "POST", "-H", "Content-Type: application/json", "-H", `Idempotency-Key: "curl-1"`, "--data-binary", chargeBody}
	head1, body1 := curl(t, f.url+"/charges", args...)
	if !strings.HasPrefix(head1, "HTTP/1.1 201 ") || headerOf(head1, httpgate.ReplayedHeader) != "" {
		t.Fatalf("first: %s", head1)
	}
	head2, body2 := curl(t, f.url+"/charges", args...)
	if !strings.HasPrefix(head2, "HTTP/1.1 201 ") || headerOf(head2, httpgate.ReplayedHeader) != "true" {
		t.Fatalf("replay: %s", head2)
	}
	if !bytes.Equal(body1, body2) || headerOf(head1, "X-Charge-Id") != headerOf(head2, "X-Charge-Id") {
		t.Fatalf("replay body %q, first %q", body2, body1)
	}
	viaGo := post(t, f.url+"/charges", `"curl-1"`, chargeBody)
	if !bytes.Equal(viaGo.body, body1) {
		t.Fatalf("Go client body %q, curl's %q", viaGo.body, body1)
	}
	if got := f.p.charges.Load(); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}

	head, body := curl(t, f.url+"/charges", "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", chargeBody)
	if !strings.HasPrefix(head, "HTTP/1.1 400 ") || headerOf(head, "Content-Type") != httpgate.ProblemContentType {
		t.Fatalf("missing key: %s", head)
	}
	problem(t, result{status: http.StatusBadRequest, header: http.Header{"Content-Type": {httpgate.ProblemContentType}}, body: body}, http.StatusBadRequest, idemgate.ReasonKeyMissing)

	head, body = curl(t, f.url+"/charges", "-X", "POST", "-H", "Content-Type: application/json", "-H", `Idempotency-Key: "curl-1"`, "--data-binary", `{"customer":"cus_9","amount":1}`)
	if !strings.HasPrefix(head, "HTTP/1.1 422 ") {
		t.Fatalf("reused key: %s %s", head, body)
	}
}
