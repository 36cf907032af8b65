package console

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/messages"
)

// chromiumPath finds Debian's chromium. The browser test fails, never
// skips, without it: `make test` installs it (make chromium).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: `make chromium` (part of `make test`) installs Debian's chromium package")
	return ""
}

// browser starts a headless chromium for the test and returns its tab's
// context, and a function returning the page's uncaught JavaScript
// exceptions so far.
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.WindowSize(1360, 860),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium refuses its sandbox as root, and it needs user
		// namespaces a CI container may not give. The browser only loads
		// the test's own loopback pages.
		chromedp.NoSandbox,
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start chromium")
	var (
		mu   sync.Mutex
		errs []string
	)
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			mu.Lock()
			errs = append(errs, e.ExceptionDetails.Text+" "+fmt.Sprint(e.ExceptionDetails.Exception))
			mu.Unlock()
		}
	}))
	return ctx, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), errs...) }
}

// shot saves a screenshot of the page as an artifact (go test -artifacts),
// and into $JETCREW_SCREENSHOTS when set (how docs/console/*.png are made).
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var (
		png []byte
		err error
	)
	// A page just navigated to may not be laid out yet ("0 width").
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil || time.Now().After(deadline) {
			break
		}
	}
	require.NoError(t, err, "screenshot %s", name)
	dirs := []string{t.ArtifactDir()}
	if d := os.Getenv("JETCREW_SCREENSHOTS"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		require.NoError(t, os.WriteFile(filepath.Join(d, name+".png"), png, 0o644))
	}
}

// phoneWidth is the viewport width, in CSS pixels, every page must fit
// without scrolling sideways (a phone's, issue 27).
const phoneWidth = 390

// onPhone lays the current page out as a phone phoneWidth pixels wide
// shows it, checks nothing on it scrolls sideways
// (document.documentElement.scrollWidth <= phoneWidth), saves a screenshot
// as name-phone, and lays the page out at the browser's own size again.
func onPhone(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	metrics := func(p emulation.SetDeviceMetricsOverrideParams) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetDeviceMetricsOverride, p)
			return err
		})
	}
	require.NoError(t, chromedp.Do(ctx, metrics(emulation.SetDeviceMetricsOverrideParams{Width: phoneWidth, Height: 844, DeviceScaleFactor: 2, Mobile: true})))
	defer func() {
		require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.ClearDeviceMetricsOverride, cdp.Empty{})
			return err
		})))
	}()
	poll(t, ctx, 5*time.Second, fmt.Sprintf(`document.documentElement.clientWidth === %d`, phoneWidth), "the page is laid out as on a phone")
	width, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	require.NoError(t, err)
	t.Logf("%s at %d px: %d px wide", name, phoneWidth, width)
	shot(t, ctx, name+"-phone")
	require.LessOrEqual(t, width, phoneWidth, "%s scrolls sideways on a phone", name)
}

// poll waits until the JavaScript expression is true, failing the test
// with what after timeout. A navigation under way (a click on a link, a
// form posted) destroys the page the expression runs in: it is evaluated
// again in the new one. Until then it may run on the page being left, so
// expressions reach elements with ?. (an element that page lacks is not
// yet true, not an exception that ends the poll).
func poll(t *testing.T, ctx context.Context, timeout time.Duration, expr, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(max(left, time.Millisecond))))
		if err == nil {
			return
		}
		if left <= 0 || !strings.Contains(err.Error(), "(-32000)") {
			where, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 2000)`))
			require.NoError(t, err, "%s\npage: %s", what, where)
		}
		time.Sleep(20 * time.Millisecond) // the next page is loading
	}
}

// click clicks the element sel names. A live page may draw it again
// between the query and the click (the run page redraws its actions when
// the run's state changes): the node the query found is then gone
// (-32000, "Could not find node with given id") before any mouse event
// was sent, and the click is tried again on the element now there.
func click[S chromedp.Selectable](t *testing.T, ctx context.Context, sel S) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := chromedp.Do(ctx, chromedp.Click(sel))
		if err == nil || time.Now().After(deadline) || !strings.Contains(err.Error(), "(-32000)") {
			require.NoError(t, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBrowser drives the console in headless chromium against a real
// worker (on the fake runtime): live list, live output, cancel, hostile
// output, replay from the dead letters, a group's conversation.
func TestBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	u := b.srv.URL

	// A run submitted while the list is open appears without a reload.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/runs")))
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the runs page's live stream opens")
	// The page never reloads itself (app.js has no reload; its timers only move the clocks), so
	// the row can only come from the live stream; the delay is logged.
	id := dispatcher.NewRunID()
	start := time.Now()
	b.submit(t, messages.RunRequest{ID: id, Prompt: "out hello-from-run;sleep 1h", Labels: map[string]string{"team": "docs"}})
	poll(t, ctx, 10*time.Second, `document.querySelector('tr[data-id="`+id+`"]') !== null`, "the submitted run appears in the open list")
	t.Logf("submitted run appeared in the open list %s after its submit returned", time.Since(start).Round(time.Millisecond))
	poll(t, ctx, 15*time.Second, `document.querySelector('tr[data-id="`+id+`"] .badge')?.textContent === "running"`, "its state turns running live")
	shot(t, ctx, "runs")
	onPhone(t, ctx, "runs")

	// Its page streams its output; cancel stops it.
	click(t, ctx, chromedp.CSS(`tr[data-id="`+id+`"] a`))
	poll(t, ctx, 15*time.Second, `document.getElementById("output")?.textContent.includes("hello-from-run")`, "the run's output streams in")
	shot(t, ctx, "run")
	onPhone(t, ctx, "run")
	click(t, ctx, chromedp.ID("cancel"))
	poll(t, ctx, 5*time.Second, `document.getElementById("confirm") !== null`, "the cancel asks for a confirmation")
	click(t, ctx, chromedp.ID("confirm"))
	poll(t, ctx, 10*time.Second, `document.getElementById("state")?.textContent === "cancelled"`, "the page shows the run cancelled")
	require.Equal(t, messages.StateCancelled, b.waitState(t, id, messages.StateCancelled).State)

	// Hostile output shows as text: no script runs, no element is made.
	const evil = `<script>window.pwned=1</script><img src=x onerror=window.pwned=2><b>bold</b>`
	x := b.submit(t, messages.RunRequest{Prompt: "out " + evil + "\x1b[2J\u202e;exit 3", Labels: map[string]string{"x": "<i>label</i>"}})
	b.waitState(t, x, messages.StateFailed)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/runs/"+x)))
	poll(t, ctx, 15*time.Second, `document.getElementById("output")?.textContent.includes("<script>window.pwned=1</script>")`, "the markup shows as text")
	inert, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === undefined &&
		document.querySelectorAll("main img, main b, main i, main script").length === 0 &&
		document.getElementById("output").textContent.includes("␛[2J<U+202E>")`))
	require.NoError(t, err)
	require.True(t, inert, "hostile output stayed inert, control characters visible")
	shot(t, ctx, "run-hostile")

	// Replay from the dead letters page, after the confirmation.
	require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), x); return err == nil }, 15*time.Second, 10*time.Millisecond)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/dead-letters")))
	shot(t, ctx, "dead-letters")
	onPhone(t, ctx, "dead-letters")
	click(t, ctx, chromedp.CSS(`button.replay-one[data-run="`+x+`"]`))
	poll(t, ctx, 15*time.Second, `document.getElementById("confirm") !== null`, "a confirmation is asked")
	shot(t, ctx, "replay-confirm")
	click(t, ctx, chromedp.ID("confirm"))
	poll(t, ctx, 10*time.Second, `(document.getElementById("message")||{}).textContent?.includes("Replayed 1 run(s)")`, "the replay is reported")
	require.Eventually(t, func() bool {
		st, err := b.d.Status(t.Context(), x)
		return err == nil && st.Replays == 1 && st.State.Final()
	}, 10*time.Second, 10*time.Millisecond, "the replayed request ran again")

	// A group's conversation: a message sent between two runs.
	g := "crew-" + strings.ToLower(id[20:])
	a := b.submit(t, messages.RunRequest{Group: g, Prompt: "out a"})
	c := b.submit(t, messages.RunRequest{Group: g, Prompt: "out c"})
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/groups/default/"+g)))
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the group page's live stream opens")
	b.coordSend(t, g, a, c, "tests pass on my side; <b>merge</b>?")
	poll(t, ctx, 15*time.Second, `[...document.querySelectorAll("#thread tr")].some(r => r.textContent.includes("`+a+`") && r.textContent.includes("`+c+`") && r.textContent.includes("<b>merge</b>?"))`,
		"the group page shows the message between the two runs, as text")
	shot(t, ctx, "group")
	onPhone(t, ctx, "group")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u+"/")))
	poll(t, ctx, 15*time.Second, `document.querySelector("#overview-body table") !== null`, "the overview renders")
	// Its charts: four inline SVGs, each titled for a screen reader, laid
	// out with a width, and bars for the runs above.
	poll(t, ctx, 15*time.Second, `[...document.querySelectorAll("#trends svg[role=img]")].filter(s =>
		s.getBoundingClientRect().width > 100 && document.getElementById(s.getAttribute("aria-labelledby").split(" ")[0])?.textContent).length === 4 &&
		document.querySelectorAll("#chart-runs-hour rect").length > 0`, "the overview's charts render, titled")
	shot(t, ctx, "overview")
	onPhone(t, ctx, "overview")
	// The overview follows the runs: a run's state written while it is
	// open is counted in its body, swapped in without a reload.
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the overview's live stream opens")
	total, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#overview-body .states .muted").textContent`))
	require.NoError(t, err)
	var runs int
	_, err = fmt.Sscanf(total, "%d in all", &runs)
	require.NoError(t, err, "the overview counts the runs: %q", total)
	at := time.Now().UTC()
	b.putStates(t, messages.RunState{ID: "overview-live-1", Pool: messages.DefaultPool, State: messages.StateSucceeded, QueuedAt: at, UpdatedAt: at})
	poll(t, ctx, 15*time.Second, fmt.Sprintf(`document.querySelector("#overview-body .states .muted")?.textContent === "%d in all"`, runs+1),
		"the overview swaps in its body when a run changes")
	require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}})
		return err
	}), chromedp.Navigate(u+"/runs/"+x)))
	poll(t, ctx, 15*time.Second, `document.getElementById("output")?.textContent.length > 0`, "the run page renders, dark")
	shot(t, ctx, "run-dark")
	require.Empty(t, exceptions(), "no JavaScript error on any page")
}

// TestBrowserBudget drives a run paused by its budget: its page shows its
// usage and follows its running totals live, "Raise budget" grants the
// amount typed (grant.run.<id> in jetcrew-budgets), and the button goes
// once the run is no longer paused.
func TestBrowserBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	kv := budgetsBucket(t, b.js)
	ctx, exceptions := browser(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	now := time.Now().UTC()
	st := pausedRun("paused-b", now)
	b.putStates(t, st)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/runs/paused-b")))
	poll(t, ctx, 15*time.Second, `document.getElementById("live")?.classList.contains("on")`, "the run page's live stream opens")
	poll(t, ctx, 5*time.Second, `!document.getElementById("raise-form").hidden &&
		document.getElementById("usage-facts").textContent.includes("12,345 in · 2,345 out")`, "the usage and the button show")
	shot(t, ctx, "run-usage")

	// Running totals arrive live.
	st.Usage.Requests, st.Usage.Tokens.Output, st.UpdatedAt = 8, 2400, now.Add(time.Second)
	b.putStates(t, st)
	poll(t, ctx, 10*time.Second, `document.getElementById("usage-facts").textContent.includes("2,400 out")`, "the totals update live")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("raise-usd"), "0.75"),
		chromedp.Click(chromedp.ID("raise"))))
	require.Eventually(t, func() bool {
		v, _, err := budgetkv.Get(t.Context(), kv, messages.GrantKey(messages.BudgetScopeRun, "paused-b"))
		return err == nil && v.CostUSD == 0.75
	}, 10*time.Second, 10*time.Millisecond, "the grant reached jetcrew-budgets")
	poll(t, ctx, 10*time.Second, `location.pathname === "/runs/paused-b" && document.getElementById("live")?.classList.contains("on")`, "back on the run's page")

	// The worker sees the grant and clears the pause: the button goes.
	st.Budget, st.UpdatedAt = "", now.Add(2*time.Second)
	b.putStates(t, st)
	poll(t, ctx, 10*time.Second, `document.getElementById("raise-form").hidden && document.getElementById("budget").hidden`, "the button goes with the pause")
	require.Empty(t, exceptions(), "no JavaScript error")
}
