package credential

import (
	"errors"
	"net/http"
	"testing"
)

func TestBearerToken(t *testing.T) {
	t.Parallel()
	const tok = "nlc_abc"
	tests := []struct {
		name   string
		values []string // Authorization headers, as received
		want   string
		err    error
	}{
		{"no header", nil, "", ErrMissingCredential},
		{"empty header", []string{""}, "", ErrMissingCredential},
		{"Bearer alone", []string{"Bearer"}, "", ErrMissingCredential},
		{"Bearer and a space", []string{"Bearer "}, "", ErrMissingCredential},
		{"Bearer and spaces", []string{"Bearer   \t "}, "", ErrMissingCredential},
		{"Basic", []string{"Basic dXNlcjpwYXNz"}, "", ErrMissingCredential},
		{"other scheme", []string{"Token " + tok}, "", ErrMissingCredential},
		{"scheme glued to token", []string{"Bearer" + tok}, "", ErrMissingCredential},
		{"token without scheme", []string{tok}, "", ErrMissingCredential},
		{"two headers", []string{"Bearer " + tok, "Bearer " + tok}, "", ErrInvalidToken},
		{"Bearer", []string{"Bearer " + tok}, tok, nil},
		{"lower-case scheme", []string{"bearer " + tok}, tok, nil},
		{"upper-case scheme", []string{"BEARER " + tok}, tok, nil},
		{"two spaces", []string{"Bearer  " + tok}, tok, nil},
		{"surrounding space", []string{" Bearer " + tok + " "}, tok, nil},
		{"inner space kept for Verify to refuse", []string{"Bearer " + tok + " x"}, tok + " x", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for _, v := range tc.values {
				h.Add("Authorization", v)
			}
			got, err := BearerToken(h)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("BearerToken err = %v, want %v", err, tc.err)
			}
			if got != tc.want {
				t.Fatalf("BearerToken = %q, want %q", got, tc.want)
			}
		})
	}
}
