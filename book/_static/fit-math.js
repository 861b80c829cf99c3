// Display equations that are wider than the column (issue 22, item 3). MathJax 3 does not break
// lines, so once it has typeset the page, an equation that overflows its box is
// 1. broken at its top-level \quad / \qquad separators into as few centred lines as fit
//    (a gathered environment: the same TeX, stacked), then, if still a little too wide,
// 2. scaled down, to no less than MIN_SCALE of the text size.
// What still does not fit keeps its horizontal scroll bar (book.css) and fails the render test
// (tests/test_book.py). When done, <html data-math-fitted="1">.
(function () {
  const MIN_SCALE = 0.8;

  function overflow(el) { return el.scrollWidth - el.clientWidth > 1; }

  // Split TeX at \quad / \qquad (and the comma before them) outside braces and environments.
  function topLevelParts(tex) {
    const parts = [];
    let depth = 0, env = 0, start = 0;
    const re = /\\(begin|end)\b|\\(q?quad)(?![A-Za-z])|[{}]/g;
    let m;
    while ((m = re.exec(tex))) {
      if (m[0] === "{") depth++;
      else if (m[0] === "}") depth--;
      else if (m[1] === "begin") env++;
      else if (m[1] === "end") env--;
      else if (m[2] && depth === 0 && env === 0) {
        parts.push(tex.slice(start, m.index));
        start = m.index + m[0].length;
      }
    }
    parts.push(tex.slice(start));
    return parts.map(s => s.trim()).filter(s => s.length);
  }

  function stacked(parts, lines) {
    const per = Math.ceil(parts.length / lines), rows = [];
    for (let i = 0; i < parts.length; i += per) rows.push(parts.slice(i, i + per).join(" \\quad "));
    return "\\begin{gathered}" + rows.join(" \\\\ ") + "\\end{gathered}";
  }

  async function retypeset(host, tex) {
    MathJax.typesetClear([host]);
    host.textContent = "\\[" + tex + "\\]";
    await MathJax.typesetPromise([host]);
    return host.querySelector("mjx-container");
  }

  async function fit(item) {
    let box = item.typesetRoot;
    if (!box || !box.isConnected || !overflow(box)) return;
    const host = box.parentNode;
    const parts = topLevelParts(item.math);
    for (let lines = 2; lines <= parts.length && overflow(box); lines++) {
      box = await retypeset(host, stacked(parts, lines));
      if (!box) return;
    }
    if (overflow(box)) {
      const scale = box.clientWidth / box.scrollWidth;
      if (scale >= MIN_SCALE) box.style.fontSize = Math.floor(scale * 100 - 1) + "%";
    }
  }

  async function run() {
    try {
      await MathJax.startup.promise;
      const items = Array.from(MathJax.startup.document.math).filter(it => it.display);
      for (const item of items) await fit(item);
    } finally {
      document.documentElement.dataset.mathFitted = "1";
    }
  }

  window.addEventListener("load", () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) run();
    else document.documentElement.dataset.mathFitted = "1";
  });
})();
