// The render check of tests/test_book.py (issue 22, item 3), injected into a copy of a built page.
// Once MathJax has typeset the page and book/_static/fit-math.js has fitted its display equations,
// it measures the DOM and writes a JSON report into a hidden pre element (id render-report):
//   merror  MathJax errors (mjx-merror), the TeX shown instead of the formula;
//   math    equations wider than their box (display: scrollWidth > clientWidth) or, inline,
//           running past the right edge of the article;
//   rawtex  TeX source left on the page: a backslash in an equation's text (\_ inside \text{}),
//           or TeX delimiters and macros in the prose outside code;
//   code    <pre> blocks whose text is wider than the block (scrollWidth > clientWidth);
//   tables  tables wider than the article or than the box that holds them.
(function () {
  const SLACK = 2;   // px: glyph overhang and rounding
  function report() {
    const out = {merror: [], math: [], rawtex: [], code: [], tables: []};
    const art = document.querySelector("article.bd-article") || document.querySelector("main")
      || document.body;
    const ar = art.getBoundingClientRect();
    const text = e => (e.textContent || "").replace(/\s+/g, " ").trim().slice(0, 100);
    document.querySelectorAll("mjx-container").forEach(m => {
      if (m.querySelector("mjx-merror") || m.hasAttribute("data-mjx-error")) out.merror.push(text(m));
      const mml = m.querySelector("mjx-assistive-mml");
      const src = mml ? mml.textContent : "";
      if (src.indexOf("\\") >= 0) out.rawtex.push("in an equation: " + src.slice(0, 100));
      const r = m.getBoundingClientRect();
      const display = m.getAttribute("display") === "true";
      const over = display ? m.scrollWidth - m.clientWidth : r.right - ar.right;
      if (over > SLACK) out.math.push({display: display, over: Math.round(over), text: src.slice(0, 100)});
    });
    const walker = document.createTreeWalker(art, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const p = n.parentElement;
      if (!p || p.closest("mjx-container, pre, code, script, style, .highlight, kbd, samp")) continue;
      const s = n.textContent;
      if (/\\[A-Za-z_{}()\[\]$]|\$[^$\s][^$]*\$/.test(s)) out.rawtex.push("in the text: " + s.trim().slice(0, 100));
    }
    document.querySelectorAll("pre").forEach(pre => {
      const over = pre.scrollWidth - pre.clientWidth;
      if (over > SLACK) {
        const first = (pre.textContent.split("\n").find(l => l.trim()) || "").trim();
        out.code.push({over: over, first: first.slice(0, 80)});
      }
    });
    document.querySelectorAll("table").forEach(t => {
      const r = t.getBoundingClientRect();
      const box = t.parentElement;
      const over = Math.max(r.right - ar.right, box.scrollWidth - box.clientWidth);
      if (over > SLACK) out.tables.push({over: Math.round(over), head: text(t).slice(0, 80)});
    });
    out.page_height = document.documentElement.scrollHeight;
    out.mathjax = !!window.MathJax;
    const pre = document.createElement("pre");
    pre.id = "render-report";
    pre.style.display = "none";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function whenFitted(then) {
    const ready = () => !window.MathJax || document.documentElement.dataset.mathFitted;
    (function wait(tries) {
      if (ready() || tries > 100) setTimeout(then, 300); else setTimeout(() => wait(tries + 1), 100);
    })(0);
  }
  window.addEventListener("load", () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(() => whenFitted(report), () => whenFitted(report));
    } else {
      whenFitted(report);
    }
  });
})();
