() => {
  // Label tab keys: S same, D different, Space skip, Z undo. Never while typing in a field, and only
  // when the Label tab is showing (its buttons have a layout box only then).
  const keys = { s: "label-same", d: "label-different", " ": "label-skip", z: "label-undo" };
  const typing = "input, textarea, select, [contenteditable=''], [contenteditable='true']";
  window.siameseShortcuts = keys;
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const target = event.target instanceof Element ? event.target : null;
    if (target && target.closest(typing)) return;
    const id = keys[event.key.toLowerCase()];
    const button = id && document.getElementById(id);
    if (!button || button.offsetParent === null || button.disabled) return;
    event.preventDefault(); // Space must not scroll the page or press a focused button
    button.click();
  });
}
