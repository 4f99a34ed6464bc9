// gpuclust report: hover read-out on the inline SVG figures (no library, no network).
// Each figure's <svg data-axes> holds its axes' boxes (figure fractions), limits and scales.
// No drag-to-zoom: cropping the drawing would lose its axes and labels; the browser's zoom enlarges
// the whole figure, axes included, and it stays sharp (vector).
(function () {
  "use strict";
  var errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message)); mark(); });
  var origError = console.error;
  console.error = function () { errors.push(Array.prototype.join.call(arguments, " ")); mark(); origError.apply(console, arguments); };
  function mark() { document.body.setAttribute("data-errors", String(errors.length)); }

  function fmt(v) {
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return String(Math.round(v * 1e4) / 1e4);
  }
  function fromFrac(f, lim, scale) {
    if (scale === "log") return Math.pow(10, Math.log10(lim[0]) + f * (Math.log10(lim[1]) - Math.log10(lim[0])));
    return lim[0] + f * (lim[1] - lim[0]);
  }
  var timeLabel = document.body.getAttribute("data-time-label");
  var timeZero = Number(document.body.getAttribute("data-time-zero-ms")) || 0;
  function setup(fig) {
    var svg = fig.querySelector("svg");
    if (!svg) return false;
    var axes = JSON.parse(svg.getAttribute("data-axes") || "[]");
    var vb = svg.viewBox.baseVal, W = vb.width, H = vb.height;
    var tip = document.createElement("div"); tip.className = "tip"; fig.appendChild(tip);
    function svgPoint(ev) {
      var p = svg.createSVGPoint(); p.x = ev.clientX; p.y = ev.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse());
    }
    svg.addEventListener("mousemove", function (ev) {
      var p = svgPoint(ev), fx = p.x / W, fy = 1 - p.y / H, r = fig.getBoundingClientRect();
      for (var i = 0; i < axes.length; i++) {
        var a = axes[i], b = a.box;
        if (fx < b[0] || fx > b[2] || fy < b[1] || fy > b[3]) continue;
        var lines = [];
        if (a.xscale !== "other") lines.push((a.xlabel || "x").split("\n")[0] + ": " + fmt(fromFrac((fx - b[0]) / (b[2] - b[0]), a.x, a.xscale)));
        if (a.yscale !== "other") lines.push((a.ylabel || "y").split("\n")[0] + ": " + fmt(fromFrac((fy - b[1]) / (b[3] - b[1]), a.y, a.yscale)));
        if (a.xlabel === timeLabel && timeZero && a.xscale === "linear") {
          var h = fromFrac((fx - b[0]) / (b[2] - b[0]), a.x, "linear");
          lines.push("UTC: " + new Date(timeZero + h * 3600e3).toISOString().slice(0, 16).replace("T", " "));
        }
        if (!lines.length) break;
        tip.textContent = lines.join("\n"); tip.style.display = "block";
        tip.style.left = ev.clientX - r.left + 14 + "px"; tip.style.top = ev.clientY - r.top + 14 + "px";
        return;
      }
      tip.style.display = "none";
    });
    svg.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    var bb = svg.getBBox();
    var drawn = svg.querySelectorAll("path, use, image, rect, text").length;
    var ok = bb.width > 0 && bb.height > 0 && drawn > 0;
    fig.setAttribute("data-rendered", ok ? "yes" : "no");
    return ok;
  }
  function init() {
    var figs = document.querySelectorAll("figure.plot"), n = 0;
    for (var i = 0; i < figs.length; i++) {
      try { if (setup(figs[i])) n++; } catch (e) { errors.push("figure " + i + ": " + e); }
    }
    document.body.setAttribute("data-figures-rendered", String(n));
    mark();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
