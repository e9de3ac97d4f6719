package cmd

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// browserSession is a headless Chromium of one test: its context, and
// what the pages reported as problems (console errors, Content Security
// Policy refusals, uncaught exceptions), which the test reads under mu.
type browserSession struct {
	t           *testing.T
	ctx         context.Context
	stepTimeout time.Duration

	mu       sync.Mutex
	problems []string
}

// newBrowserSession starts the Chromium at exe with a window of width ×
// height, ended with the test; each step may take stepTimeout.
func newBrowserSession(t *testing.T, exe string, width, height int, stepTimeout time.Duration) *browserSession {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.WithoutCancel(t.Context()), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU, chromedp.WindowSize(width, height))...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	return &browserSession{t: t, ctx: ctx, stepTimeout: stepTimeout}
}

// listen records the pages' problems; enableLog, given to the first run,
// turns the console log on.
func (b *browserSession) listen() (enableLog chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Listen(b.ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch e := ev.(type) {
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError || strings.Contains(e.Entry.Text, "Content Security Policy") {
				b.problems = append(b.problems, fmt.Sprintf("log %s: %s (%s)", e.Entry.Level, e.Entry.Text, e.Entry.URL))
			}
		case *runtime.EventExceptionThrown:
			b.problems = append(b.problems, fmt.Sprintf("exception: %s at %s:%d", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
		}
	}); err != nil {
		b.t.Fatalf("starting chromium: %v", err)
	}
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, cdplog.Enable, cdp.Empty{})
		return err
	})
}

// step runs actions within the step timeout, failing the test on an error.
func (b *browserSession) step(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	sctx, c := context.WithTimeout(b.ctx, b.stepTimeout)
	defer c()
	if err := chromedp.Do(sctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval is the string a JavaScript expression gives in the page.
func (b *browserSession) eval(js string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}
