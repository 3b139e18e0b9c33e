package httpgate_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemgate/idemgate/httpgate"
)

// ServerLimits' zero value serves with the documented defaults; a negative
// field is its default too; the write timeout is per write of the answer,
// never http.Server's (which would count the handler's time).
func TestServerLimitsDefaults(t *testing.T) {
	for _, l := range []httpgate.ServerLimits{{}, {ReadTimeout: -1, WriteTimeout: -1, MaxConnections: -1}} {
		srv := l.Server(http.NotFoundHandler())
		if srv.ReadHeaderTimeout != 10*time.Second || srv.ReadTimeout != 30*time.Second || srv.IdleTimeout != 2*time.Minute ||
			srv.WriteTimeout != 0 || srv.ConnState == nil {
			t.Errorf("%+v: server read-header %s, read %s, idle %s, write %s, conn state hook %v", l,
				srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout, srv.WriteTimeout, srv.ConnState != nil)
		}
	}
}
