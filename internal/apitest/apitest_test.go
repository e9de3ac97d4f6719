package apitest_test

import (
	"net/http"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
)

func TestNew(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	if env.OperatorToken == "" || env.ProvisioningToken == "" || env.URL == "" {
		t.Fatalf("env = %+v", env)
	}
	st, body := env.Bearer(t, "", http.MethodGet, "/operator/workers", nil)
	if st != http.StatusUnauthorized {
		t.Errorf("no token: %d %s", st, body)
	}
	st, body = env.Operator(t, http.MethodGet, "/no/such/path", nil)
	if st != http.StatusNotFound {
		t.Errorf("unknown path: %d %s", st, body)
	}
}
