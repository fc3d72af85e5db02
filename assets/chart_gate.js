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
  // a tick that finds another one already waiting updates the readouts only.
  const MIN_GAP_S = 0.5; // seconds between the request's steps, at least, to draw charts between them
  const MAX_WAIT_MS = 5000; // a step that does not come: go anyway
  const inputs = args.slice(0, __N_INPUTS__ - 1);
  const view = document.querySelector('#token-view');
  if (!view || !view.querySelector('.tv-cursor')) return [...inputs, true];
  const gate = (window.__specExplorerChartGate ||= { waiting: false });
  if (gate.waiting) return [...inputs, false];
  const times = [...view.querySelectorAll('.tv-step')].slice(-6).map((s) => parseFloat(s.dataset.t));
  const gaps = times.slice(1).map((t, i) => t - times[i]).sort((a, b) => a - b);
  if (gaps.length < 2 || gaps[Math.floor(gaps.length / 2)] < MIN_GAP_S) return [...inputs, false];
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
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
    return [...inputs, true];
  } finally {
    gate.waiting = false;
  }
}
