package workerapi

import (
	"context"
	"errors"
	"testing"
)

// turn limits the requests running their database work to
// Config.MaxActiveRequests: a turn taken while all are held waits until
// one is given back (here: fails when its context ends first), and a
// turn's end gives back one token however often it is called.
func TestTurn(t *testing.T) {
	t.Parallel()
	s := &Server{turns: make(chan struct{}, 2)}
	done1, err := s.turn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	done2, err := s.turn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.turn(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("a third turn of two: %v, want it to wait until its context ended", err)
	}
	done1()
	done1()
	if n := len(s.turns); n != 1 {
		t.Fatalf("%d turns held after one ended twice, want 1", n)
	}
	done3, err := s.turn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	done2()
	done3()
	if n := len(s.turns); n != 0 {
		t.Fatalf("%d turns held after all ended, want 0", n)
	}
	// Without a limit every turn is taken at once.
	var free Server
	for range 3 {
		if _, err := free.turn(ended); err != nil {
			t.Fatalf("a turn without a limit: %v", err)
		}
	}
}
