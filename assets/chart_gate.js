async (...args) => {
  // The chart timer's gate (explorer/page.wire_chart_timer), run in the page before each tick is sent.
  // Its arguments: the tick's inputs (the last one is this gate's flag), then its outputs. It returns
  // the inputs, the flag set to whether the app may redraw charts in this tick's answer.
  //
  // A chart redraw holds the page for a few hundred ms (the app builds the figures, the page's Plotly
  // draws them) and a token of the reader's own request that arrives meanwhile waits behind it
  // (docs/benchmarks.md, "UI latency"). So while the token view streams, a tick waits for the next step
  // to land and goes out right after it, in the pause before the step after: charts are drawn between
  // steps. When steps come closer together than MIN_GAP_S, the charts wait for the request's end;
  // a tick that finds another one already waiting updates the readouts only. A view whose steps
  // stopped coming (Stop leaves the cursor) counts as not streaming after STALLED_MS.
  const MIN_GAP_S = 0.5; // seconds between the request's steps, at least, to draw charts between them
  const MAX_WAIT_MS = 5000; // a step that does not come: go anyway
  const STALLED_MS = 6000; // no new step for this long (a stopped request keeps its cursor): not streaming
  const inputs = args.slice(0, __N_INPUTS__ - 1);
  const view = document.querySelector('#token-view');
  if (!view || !view.querySelector('.tv-cursor')) return [...inputs, true];
  const gate = (window.__specExplorerChartGate ||= { waiting: false, steps: -1, changedAt: 0 });
  const steps = view.querySelectorAll('.tv-step');
  const now = performance.now();
  if (steps.length !== gate.steps) Object.assign(gate, { steps: steps.length, changedAt: now });
  const times = [...steps].slice(-6).map((s) => parseFloat(s.dataset.t));
  const gaps = times.slice(1).map((t, i) => t - times[i]).sort((a, b) => a - b);
  const median = gaps.length ? gaps[Math.floor(gaps.length / 2)] : 0; // seconds
  if (now - gate.changedAt > Math.max(STALLED_MS, 4000 * median)) return [...inputs, true];
  if (gate.waiting) return [...inputs, false];
  if (gaps.length < 2 || median < MIN_GAP_S) return [...inputs, false];
  gate.waiting = true;
  try {
    await new Promise((resolve) => {
      const observer = new MutationObserver(() => done());
      const timer = setTimeout(() => done(), MAX_WAIT_MS);
      function done() {
        observer.disconnect();
        clearTimeout(timer);
        resolve();
      }
      observer.observe(view, { childList: true, subtree: true, characterData: true });
    });
    // after the step's frame is painted (a hidden tab paints none: then 100 ms)
    await new Promise((resolve) => {
      requestAnimationFrame(() => setTimeout(resolve, 0));
      setTimeout(resolve, 100);
    });
    return [...inputs, true];
  } finally {
    gate.waiting = false;
  }
}
