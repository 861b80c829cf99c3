// Hanging indents for wrapped code lines, break points in table identifiers (issue 22, item 3). book.css wraps <pre> text inside
// the column; here each line of a highlighted block becomes a block whose continuation lines
// start two columns right of the line's own indentation, so a wrapped shape comment reads as
// part of its statement. A line that still wraps and ends in an aligned comment (the kernels'
// shape comments, "# [TILE_M, TILE_N]") first loses its alignment spaces: two spaces before the
// comment, so the comment stays whole beside its code. Highlighting is unchanged.
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
      const before = comment.previousSibling;
      if (before && before.nodeType === Node.TEXT_NODE && / {3,}$/.test(before.textContent)) {
        before.textContent = before.textContent.replace(/ {3,}$/, "  ");
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
    document.querySelectorAll("article table th, article table td").forEach(breakIdentifiers);
    document.querySelectorAll("article table").forEach(shrinkTable);
    document.querySelectorAll("div.highlight pre").forEach(wrapLines);
    document.querySelectorAll("div.highlight pre").forEach(unalignComments);
    document.documentElement.dataset.codeWrapped = "1";
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
