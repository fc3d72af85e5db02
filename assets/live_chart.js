() => {
  // The live chart's own loop (explorer/panels/load.py): every __REFRESH_MS__ ms the page fetches the
  // engine's traces from __LIVE_CHART_PATH__ (answered by the app's HTTP door, built once per tick for
  // every page: no Gradio event, no figure rebuilt per page) and redraws the chart in place with
  // Plotly.react, adding its own request's tokens/s from the token view's steps (data-t: the engine
  // host's monotonic seconds, the clock of the answer's `now`). It redraws while the engine works
  // (the time axis moves even through a long step) or when its data or the page's own steps
  // changed, never while the tab is hidden, and one draw at a time.
  // While the page's own request streams, a draw waits for its next step to land and goes right
  // after it (at most STEP_WAIT_MS): the chart is drawn in the pause between two steps, and the
  // token view the reader watches does not wait behind it.
  if (window.__specExplorerLiveChart) return;
  // what each tick did, the last 64 ([performance.now() ms, what, ms it took]): for scripts/ui_latency.py
  const state = (window.__specExplorerLiveChart = { busy: false, key: null, gd: null, traces: 0, log: [] });
  const note = (what, since) => {
    state.log.push([Math.round(performance.now()), what, Math.round(performance.now() - since)]);
    if (state.log.length > 64) state.log.shift();
  };
  const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\/$/, '');
  const BIN_S = 2;
  const STEP_WAIT_MS = 2000;

  function afterNextStep(view) {
    // resolves once the token view changed (a step landed) and that frame is painted, or after
    // STEP_WAIT_MS (a hidden tab paints none: then 100 ms after the change)
    return new Promise((resolve) => {
      const observer = new MutationObserver(() => settle());
      const timer = setTimeout(() => settle(), STEP_WAIT_MS);
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
    const since = performance.now();
    if (state.busy || document.hidden || !window.Plotly) return note(state.busy ? 'busy' : 'hidden', since);
    const gd = document.querySelector('#live-charts .js-plotly-plot');
    if (!gd || !gd.layout) return note('no plot', since);
    state.busy = true;
    try {
      const r = await fetch(`${root}__LIVE_CHART_PATH__`);
      if (!r.ok) return note(`HTTP ${r.status}`, since); // 429 (slow down) or the app not answering
      const update = await r.json();
      const fetched = Math.round(performance.now() - since);
      const view = document.querySelector('#token-view');
      if (view && view.querySelector('.tv-cursor')) await afterNextStep(view);
      const own = ownSteps(update.now);
      const key = `${update.key}|${own.x.length}|${own.y.join(',')}`;
      // unchanged, and still on screen as drawn (Gradio may mount the plot afresh): nothing to do
      const shown = key === state.key && gd === state.gd && (gd.data || []).length === state.traces;
      if (shown && !update.working) return note('same', since);
      const traces = update.traces.slice();
      if (own.x.length) {
        traces.push({ type: 'scatter', name: '__FOREGROUND_TRACE__', xaxis: 'x4', yaxis: 'y5',
                      x: own.x, y: own.y, line: { color: '#9467bd' } });
      }
      const layout = Object.assign({}, gd.layout, { shapes: update.shapes, annotations: update.annotations });
      await window.Plotly.react(gd, traces, layout);
      Object.assign(state, { key, gd, traces: traces.length });
      note(`drawn (fetched in ${fetched})`, since);
    } catch (e) {
      note(`failed: ${e}`, since); // the chart stays as it was; the next tick tries again
    } finally {
      state.busy = false;
    }
  }
  setInterval(tick, __REFRESH_MS__);
}
