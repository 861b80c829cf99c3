// The render check of tests/test_book.py (issue 22, item 3), injected into a copy of a built page.
// Once MathJax has typeset the page and book/_static/fit-math.js has fitted its display equations,
// it measures the DOM and writes a JSON report into a hidden pre element (id render-report):
//   merror  MathJax errors (mjx-merror), the TeX shown instead of the formula;
//   math    equations wider than their box (display: scrollWidth > clientWidth) or, inline,
//           running past the right edge of the article;
//   rawtex  TeX source left on the page: a backslash in an equation's text (\_ inside \text{}),
//           or TeX delimiters and macros in the prose outside code;
//   code    <pre> blocks whose text is wider than the block (scrollWidth > clientWidth);
//   tables  tables wider than the article or than the box that holds them;
//   towers  interval cells ("0.998 [0.994, 1.002]") wrapped to more than two lines;
//   groups  multi-index tables whose group rows (a row header spanning rows) have no rule above;
//   images  the number of images in cell outputs (compared with the notebook), broken_images;
//   listings  per highlighted code block, the column at which each line's text starts on the
//           screen (null for a blank line), compared with the source's indentation by the test.
(function () {
  const SLACK = 2;   // px: glyph overhang and rounding
  function report() {
    const out = {merror: [], math: [], rawtex: [], code: [], tables: [], towers: [], groups: []};
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
    document.querySelectorAll("table td").forEach(td => {
      if (!td.querySelector(".ci-part") && !/^\s*\S*\s*\[[^\]]*\]\s*$/.test(td.textContent)) return;
      // The lines the cell's text takes (its row may be taller because of another cell).
      const r = document.createRange();
      r.selectNodeContents(td);
      const tops = new Set(Array.from(r.getClientRects()).filter(c => c.width > 0).map(c => Math.round(c.top)));
      if (tops.size > 2) out.towers.push({lines: tops.size, text: text(td)});
    });
    document.querySelectorAll("table tbody tr").forEach(tr => {
      const head = Array.from(tr.children).find(c => c.tagName === "TH" && c.rowSpan > 1);
      if (!head || !tr.previousElementSibling) return;
      const ruled = Array.from(tr.children).every(c => parseFloat(getComputedStyle(c).borderTopWidth) >= 1);
      if (!ruled) out.groups.push(text(head) + " | " + text(tr).slice(0, 60));
    });
    const imgs = art.querySelectorAll("div.cell_output img");
    out.images = imgs.length;
    out.broken_images = Array.from(imgs).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(-60));
    out.listings = Array.from(document.querySelectorAll("div.highlight pre")).map(pre => {
      const box = pre.getBoundingClientRect();
      const cs = getComputedStyle(pre);
      const left = box.left + pre.clientLeft + parseFloat(cs.paddingLeft) - pre.scrollLeft;
      const lines = pre.querySelectorAll("span.line-wrap");
      const starts = [];
      (lines.length ? Array.from(lines) : [pre]).forEach(line => {
        const w = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
        for (let n = w.nextNode(); n; n = w.nextNode()) {
          const i = n.textContent.search(/[^\s\u200b]/);
          if (i < 0) continue;
          const r = document.createRange();
          r.setStart(n, i);
          r.setEnd(n, i + 1);
          const c = r.getBoundingClientRect();
          starts.push(c.width > 0 ? Math.round((c.left - left) / c.width) : null);
          return;
        }
        starts.push(null);
      });
      return starts;
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
