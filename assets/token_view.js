// Keep the newest tokens in sight while streaming, unless the reader scrolled up.
const box = element.querySelector('.tv-text');
if (box) {
  let pinned = true;
  box.addEventListener('scroll', () => {
    pinned = box.scrollTop + box.clientHeight >= box.scrollHeight - 20;
  });
  new MutationObserver(() => { if (pinned) box.scrollTop = box.scrollHeight; })
    .observe(element, { childList: true, subtree: true });
}
