// Hanging indents for wrapped code lines (issue 22, item 3). book.css wraps <pre> text inside
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

  function run() {
    document.querySelectorAll("div.highlight pre").forEach(wrapLines);
    document.querySelectorAll("div.highlight pre").forEach(unalignComments);
    document.documentElement.dataset.codeWrapped = "1";
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
