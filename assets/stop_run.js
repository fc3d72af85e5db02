(view, card) => {
  // Stop cancels the run's event in Gradio (no more updates come from the app; the app closes the
  // stream and vLLM aborts the request), so the page marks what streamed as stopped itself: the
  // cursor goes, the footer and the card say how far the request got. Numbers only; no text inserted.
  if (!view || !view.streaming) return [view, card];
  const m = /(\d+) tokens so far/.exec(typeof card === 'string' ? card : '');
  const tokens = m ? `${Number(m[1])} tokens, ` : '';
  const steps = `${Number(view.steps) || 0} engine steps`;
  const footer = `Stopped: ${tokens}${steps}; vLLM aborted the request.`;
  const said = `**Stopped** after ${tokens}${steps}: vLLM aborted the request, so it has no final numbers.`;
  return [{ ...view, streaming: false, footer }, said];
}
