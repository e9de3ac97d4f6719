package client_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
)

// New and NewRunner refuse a missing or invalid setting with an error
// that wraps ErrConfig and names it.
func TestConstructorsFailFast(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	clientTests := []struct {
		name string
		base string
		cfg  *client.Config
		want string
	}{
		{"nil config", "http://127.0.0.1:1", nil, "Identity"},
		{"no identity", "http://127.0.0.1:1", &client.Config{}, "Identity"},
		{"relative URL", "/workers", &client.Config{Identity: id}, "base URL"},
		{"ftp URL", "ftp://cp.example", &client.Config{Identity: id}, "base URL"},
		{"query", "http://cp.example/?a=1", &client.Config{Identity: id}, "base URL"},
		{"negative timeout", "https://cp.example", &client.Config{Identity: id, RequestTimeout: -1}, "RequestTimeout"},
		{"negative retry base", "https://cp.example", &client.Config{Identity: id, RetryBase: -time.Second}, "RetryBase"},
		{"negative attempts", "https://cp.example", &client.Config{Identity: id, MaxAttempts: -1}, "MaxAttempts"},
	}
	for _, tt := range clientTests {
		t.Run("New/"+tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := client.New(tt.base, tt.cfg)
			if !errors.Is(err, client.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want ErrConfig naming %s", err, tt.want)
			}
		})
	}
	c, err := client.New("https://cp.example", &client.Config{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	runnerTests := []struct {
		name string
		c    *client.Client
		cfg  *client.RunnerConfig
		want string
	}{
		{"nil client", nil, nil, "Client"},
		{"wait over the protocol", c, &client.RunnerConfig{WaitSeconds: 61}, "WaitSeconds"},
		{"negative wait", c, &client.RunnerConfig{WaitSeconds: -1}, "WaitSeconds"},
		{"negative drain", c, &client.RunnerConfig{DrainTimeout: -time.Second}, "DrainTimeout"},
		{"negative margin", c, &client.RunnerConfig{LeaseMargin: -time.Second}, "LeaseMargin"},
		{"negative batch", c, &client.RunnerConfig{LogBatchSize: -1}, "LogBatchSize"},
		{"negative concurrency", c, &client.RunnerConfig{MaxConcurrent: -2}, "MaxConcurrent"},
	}
	for _, tt := range runnerTests {
		t.Run("NewRunner/"+tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := client.NewRunner(tt.c, tt.cfg)
			if !errors.Is(err, client.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewRunner: %v, want ErrConfig naming %s", err, tt.want)
			}
		})
	}
	if _, err := client.NewRunner(c, nil); err != nil {
		t.Errorf("NewRunner with defaults: %v", err)
	}
}
