async (status, banner) => {
  // The engine's status line and the banners, fetched every second straight from the app's
  // __TOP_LINES_PATH__ (answered by the app's HTTP door, explorer/request_limits.py, without Gradio: a
  // Gradio call would build a whole session's state each time). The same tick as a Gradio event with a backend
  // function made the page's client update the loading state of every component several times per
  // tick, on the main thread that draws the token view (docs/benchmarks.md, "UI latency"). If the app
  // does not answer, both lines stay as they were and the status line says so.
  const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\/$/, '');
  const note = '⚠ **The app is not answering**: the line below may be out of date.';
  try {
    const r = await fetch(`${root}__TOP_LINES_PATH__`);
    if (r.status === 429) return [status, banner]; // the app asks this address to slow down: next second
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const pair = await r.json(); // [status line, banners]
    if (!Array.isArray(pair) || pair.length !== 2) throw new Error('unexpected answer');
    return pair;
  } catch (e) {
    const old = String(status || '');
    return [old.startsWith(note) ? old : `${note}\n\n${old}`, banner];
  }
}
