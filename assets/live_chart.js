() => {
  // The live chart's own loop (explorer/panels/load.py): the page fetches the engine's traces from
  // __LIVE_CHART_PATH__ (answered by the app's HTTP door, built once per tick for every page: no
  // Gradio event, no figure rebuilt per page) and redraws the chart in place with Plotly.react, adding
  // its own request's tokens/s from the token view's steps (data-t: the engine host's monotonic
  // seconds, the clock of the answer's `now`). It redraws while the engine works (the time axis moves
  // even through a long step) or when its data or the page's own steps changed, never while the tab
  // is hidden, and one draw at a time: each tick schedules the next, so a slow answer delays the
  // loop and never piles draws up.
  // Redraws are due PERIOD_MS apart at most (end to end; aimed at DUE_MS), and never closer than
  // MIN_GAP_MS. While the page's own request streams, a draw waits for its next step to land and
  // goes right after it, in the pause between two steps (the token view the reader watches does not
  // wait behind it), but no later than its due time: the tick that draws starts early enough to
  // fetch and still leave that wait. A tick that did not draw looks again IDLE_MS later; one the
  // app refused or did not answer, after its Retry-After or PERIOD_MS, whichever is longer.
  if (window.__specExplorerLiveChart) return;
  // what each tick did, the last 64 ([performance.now() ms, what, ms it took]): for scripts/ui_latency.py
  const state = (window.__specExplorerLiveChart = {
    key: null, gd: null, traces: 0, drawnAt: null, fetchMs: 200, drawMs: [], log: [] });
  const note = (what, since) => {
    state.log.push([Math.round(performance.now()), what, Math.round(performance.now() - since)]);
    if (state.log.length > 64) state.log.shift();
  };
  const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\/$/, '');
  const BIN_S = 2;
  const PERIOD_MS = __REFRESH_MS__; // a redraw at least this often while the engine works
  const DUE_MS = 0.9 * PERIOD_MS; // aimed at: the rest is room for a late timer or a slow frame
  const STEP_SLACK_MS = 800; // the wait for a step that a drawing tick leaves itself
  const MIN_GAP_MS = PERIOD_MS / 4; // a slow page's draws still leave its main thread this much
  const IDLE_MS = 0.75 * PERIOD_MS; // nothing changed: the next look (a change is drawn by 2 s)
  const FETCH_TIMEOUT_MS = 5 * PERIOD_MS; // an answer that never comes does not stop the loop
  // the draw's own time (Plotly.react), kept within the period: the longest of the last 8
  const drawMs = () => Math.max(100, ...state.drawMs);

  function afterNextStep(view, maxWaitMs) {
    // resolves once the token view changed (a step landed) and that frame is painted, or after
    // maxWaitMs (a hidden tab paints none: then 100 ms after the change)
    return new Promise((resolve) => {
      const observer = new MutationObserver(() => settle());
      const timer = setTimeout(() => settle(), maxWaitMs);
      function settle() {
        observer.disconnect();
        clearTimeout(timer);
        requestAnimationFrame(() => setTimeout(resolve, 0));
        setTimeout(resolve, 100);
      }
      observer.observe(view, { childList: true, subtree: true, characterData: true });
    });
  }

  function ownSteps(now) {
    // [bin centre, tokens/s] of this page's request: kept tokens per BIN_S bin of its steps' times
    const bins = new Map();
    for (const el of document.querySelectorAll('#token-view .tv-step')) {
      const t = parseFloat(el.dataset.t);
      if (!Number.isFinite(t)) continue;
      const bin = Math.floor((t - now) / BIN_S) * BIN_S + BIN_S / 2;
      const kept = el.querySelectorAll('.tv-tok:not(.k-rejected)').length;
      bins.set(bin, (bins.get(bin) || 0) + kept / BIN_S);
    }
    const xs = [...bins.keys()].sort((a, b) => a - b);
    return { x: xs, y: xs.map((x) => bins.get(x)) };
  }

  async function tick() {
    // one look at the engine: 'drawn', 'idle' (nothing to draw) or, the app refused or did not
    // answer, the ms to wait before the next look
    const since = performance.now();
    if (document.hidden || !window.Plotly) return idle('hidden', since);
    const gd = document.querySelector('#live-charts .js-plotly-plot');
    if (!gd || !gd.layout) return idle('no plot', since);
    const r = await fetch(`${root}__LIVE_CHART_PATH__`, { signal: AbortSignal.timeout(FETCH_TIMEOUT_MS) });
    if (!r.ok) { // 429 (slow down) or the app not answering
      note(`HTTP ${r.status}`, since);
      return Math.max(PERIOD_MS, 1000 * (parseFloat(r.headers.get('Retry-After')) || 0));
    }
    const update = await r.json();
    const fetched = Math.round(performance.now() - since);
    state.fetchMs = 0.7 * state.fetchMs + 0.3 * fetched;
    const view = document.querySelector('#token-view');
    const streaming = !!(view && view.querySelector('.tv-cursor'));
    // the time left before this draw is due (the first: one wait for a step, if the page's own streams)
    const first = streaming ? STEP_SLACK_MS : 0;
    const left = state.drawnAt === null ? first : state.drawnAt + DUE_MS - drawMs() - performance.now();
    if (streaming && left > 0) await afterNextStep(view, left);
    else if (left > 0 && update.working) await new Promise((resolve) => setTimeout(resolve, left));
    const own = ownSteps(update.now);
    const key = `${update.key}|${own.x.length}|${own.y.join(',')}`;
    // unchanged, and still on screen as drawn (Gradio may mount the plot afresh): nothing to do
    const shown = key === state.key && gd === state.gd && (gd.data || []).length === state.traces;
    if (shown && !update.working) return idle('same', since);
    const traces = update.traces.slice();
    if (own.x.length) {
      traces.push({ type: 'scatter', name: '__FOREGROUND_TRACE__', xaxis: 'x4', yaxis: 'y5',
                    x: own.x, y: own.y, line: { color: '#9467bd' } });
    }
    const layout = Object.assign({}, gd.layout, { shapes: update.shapes, annotations: update.annotations });
    const drawing = performance.now();
    await window.Plotly.react(gd, traces, layout);
    const drawn = performance.now();
    state.drawMs = [...state.drawMs.slice(-7), drawn - drawing];
    Object.assign(state, { key, gd, traces: traces.length, drawnAt: drawn });
    note(`drawn (fetched in ${fetched}, drawn in ${Math.round(drawn - drawing)})`, since);
    return 'drawn';
  }

  function idle(what, since) {
    note(what, since);
    return 'idle';
  }

  function nextTickIn(since, outcome) {
    // a drawing tick starts so that its fetch and a wait for a step fit before the next draw is due
    if (typeof outcome === 'number') return outcome;
    if (outcome === 'idle') return Math.max(0, since + IDLE_MS - performance.now());
    const lead = drawMs() + Math.min(state.fetchMs, PERIOD_MS / 2) + STEP_SLACK_MS;
    const now = performance.now();
    return Math.max(state.drawnAt + MIN_GAP_MS - now, state.drawnAt + DUE_MS - lead - now, 0);
  }

  async function loop() {
    const since = performance.now();
    let outcome = PERIOD_MS;
    try {
      outcome = await tick();
    } catch (e) {
      note(`failed: ${e}`, since); // the chart stays as it was; the next tick tries again
    }
    setTimeout(loop, nextTickIn(since, outcome));
  }
  setTimeout(loop, PERIOD_MS / 2);
}
