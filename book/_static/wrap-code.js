// Hanging indents for wrapped code lines, break points in table identifiers (issue 22, item 3). book.css wraps <pre> text inside
// the column; here each line of a highlighted block becomes a block whose continuation lines
// start two columns right of the line's own indentation, so a wrapped shape comment reads as
// part of its statement. A line that still wraps and ends in an aligned comment (the kernels'
// shape comments, "# [TILE_M, TILE_N]") first loses its alignment spaces: two spaces before the
// comment, so the comment stays whole beside its code; a comment alone on its line keeps its
// indentation. Every line starts at its source column. Highlighting is unchanged.
(function () {
  function wrapLines(pre) {
    if (pre.dataset.wrapped) return;
    pre.dataset.wrapped = "1";
    const nodes = Array.from(pre.childNodes);
    const lines = [[]];
    for (const node of nodes) {
      if (node.nodeType === Node.TEXT_NODE && node.textContent.indexOf("\n") >= 0) {
        const parts = node.textContent.split("\n");
        parts.forEach((part, i) => {
          if (i > 0) lines.push([]);
          if (part) lines[lines.length - 1].push(document.createTextNode(part));
        });
      } else {
        lines[lines.length - 1].push(node);
      }
    }
    if (lines.length && lines[lines.length - 1].length === 0) lines.pop();
    pre.textContent = "";
    for (const parts of lines) {
      const span = document.createElement("span");
      span.className = "line-wrap";
      parts.forEach(p => span.appendChild(p));
      const text = span.textContent;
      const indent = text.length - text.replace(/^[ ]+/, "").length;
      span.style.paddingLeft = (indent + 2) + "ch";
      span.style.textIndent = "-" + (indent + 2) + "ch";
      if (!text.length) span.appendChild(document.createTextNode("\u200b"));
      pre.appendChild(span);
    }
  }
  function wraps(span, lineHeight) { return span.getBoundingClientRect().height > 1.5 * lineHeight; }

  function unalignComments(pre) {
    const lineHeight = parseFloat(getComputedStyle(pre).lineHeight) || 18;
    pre.querySelectorAll("span.line-wrap").forEach(line => {
      if (!wraps(line, lineHeight)) return;
      const comment = Array.from(line.children).reverse().find(c => c.classList.contains("c1"));
      if (!comment) return;
      // A comment alone on its line keeps its indentation: it belongs to the block it sits in
      // (shortening it moved "# Every row sees key 0" out of its loop).
      let code = "";
      for (let n = line.firstChild; n && n !== comment; n = n.nextSibling) code += n.textContent;
      if (!code.trim()) return;
      const before = comment.previousSibling;
      if (before && before.nodeType === Node.TEXT_NODE && / {3,}$/.test(before.textContent)) {
        before.textContent = before.textContent.replace(/ {3,}$/, "  ");
      }
    });
  }

  // A deeply indented line whose first word does not fit beside its indentation would start on
  // the continuation line (two columns right of its source column): such a line may break
  // inside words instead, so its text starts where the source has it.
  function keepIndentation(pre) {
    pre.querySelectorAll("span.line-wrap").forEach(line => {
      const w = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
      for (let n = w.nextNode(); n; n = w.nextNode()) {
        const i = n.textContent.search(/[^\s\u200b]/);
        if (i < 0) continue;
        const r = document.createRange();
        r.setStart(n, i);
        r.setEnd(n, i + 1);
        const first = r.getBoundingClientRect().top, top = line.getBoundingClientRect().top;
        if (first - top > 2) line.style.wordBreak = "break-all";
        return;
      }
    });
  }

  // Tables: identifiers in headers and cells ("loop_split@64x128", "stack_bytes", "sm_90") may
  // break after _ @ / = (a <wbr>, which copying ignores), so a column is as narrow as its words.
  function breakIdentifiers(cell) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (/[_@\/=][^\s]/.test(n.textContent)) nodes.push(n);
    }
    for (const n of nodes) {
      const frag = document.createDocumentFragment();
      n.textContent.split(/(?<=[_@\/=])(?=\S)/).forEach((part, i) => {
        if (i) frag.appendChild(document.createElement("wbr"));
        frag.appendChild(document.createTextNode(part));
      });
      n.parentNode.replaceChild(frag, n);
    }
  }

  // Interval cells: "0.998 [0.994, 1.002]" may break before the bracket only (class ci-part,
  // nowrap in book.css), so a narrow column shows two lines, not a tower of three.
  const INTERVAL = /^(\s*)([^\s\[]+\s+)?(\[[^\]\[]*\])(\s*)$/;
  function keepIntervals(cell) {
    if (cell.children.length) return;
    const m = cell.textContent.match(INTERVAL);
    if (!m) return;
    cell.textContent = "";
    const part = text => {
      const s = document.createElement("span");
      s.className = "ci-part";
      s.textContent = text;
      return s;
    };
    if (m[2]) cell.append(part(m[2].trimEnd()), " ");
    cell.append(part(m[3]));
  }

  // A table still a little wider than its box after that: smaller type, to no less than
  // TABLE_MIN_SCALE of the table size set in book.css. What still does not fit fails the render test.
  const TABLE_MIN_SCALE = 0.85;
  function shrinkTable(table) {
    const box = table.parentElement;
    const over = () => Math.max(table.getBoundingClientRect().width, box.scrollWidth) - box.clientWidth;
    if (over() <= 1) return;
    const size = parseFloat(getComputedStyle(table).fontSize);
    for (let scale = 0.97; scale >= TABLE_MIN_SCALE - 1e-9 && over() > 1; scale -= 0.03) {
      table.style.fontSize = (size * scale).toFixed(2) + "px";
    }
  }

  function run() {
    document.querySelectorAll("article table td").forEach(keepIntervals);
    document.querySelectorAll("article table th, article table td").forEach(breakIdentifiers);
    document.querySelectorAll("article table").forEach(shrinkTable);
    document.querySelectorAll("div.highlight pre").forEach(wrapLines);
    document.querySelectorAll("div.highlight pre").forEach(unalignComments);
    document.querySelectorAll("div.highlight pre").forEach(keepIndentation);
    document.documentElement.dataset.codeWrapped = "1";
  }
  // The window's width changes, or a hidden cell opens (a click on its toggle): measure again.
  let again = null;
  function remeasure() {
    clearTimeout(again);
    again = setTimeout(() => document.querySelectorAll("div.highlight pre").forEach(pre => {
      pre.querySelectorAll("span.line-wrap").forEach(l => { l.style.wordBreak = ""; });
      keepIndentation(pre);
    }), 150);
  }
  window.addEventListener("resize", remeasure);
  document.addEventListener("click", remeasure);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
