"""Figures drawn without matplotlib: a few kinds of axes content, written as SVG or as PNG.

Importing matplotlib (and pandas, which the matplotlib plots draw from) costs about a second of
every ``gpuclust analyze`` that writes a figure, more than the analysis itself on a small cell
(issue 33).  The figures whose content is simple (filled steps, lines, bars, spans) are drawn here
instead, from NumPy arrays, in a few milliseconds:

* :meth:`Figure.save` to ``*.svg``: text as text, and the root element's ``data-axes`` carries per
  axes its box (figure fractions, origin bottom left), limits, scales and labels, which the report
  page's hover reads (a drawing over :data:`gpuclust.report.svg.MAX_SVG_BYTES` is a PNG inside the
  SVG, with the same ``data-axes``);
* to ``*.png``: rasterised with Pillow (a matplotlib dependency, ~30 ms to import), drawn at twice
  the size and reduced, so edges and text are smooth.

Layout is in points (1/72 in) with the origin at the top left; the axes' margins follow from their
tick labels, axis labels and legends, like matplotlib's constrained layout.  Colours are
matplotlib's default cycle (``C0`` ...), font sizes its named sizes, the font DejaVu Sans (the one
matplotlib ships and uses by default).

Modules: :mod:`~gpuclust.report.draw.figure` (:class:`Figure`: the grid of axes, layout, geometry,
save), :mod:`~gpuclust.report.draw.axes` (:class:`Axes`: what a panel draws, limits, transforms),
:mod:`~gpuclust.report.draw.primitives` (an axes as drawing primitives: items, ticks, labels,
colour bar, legend), :mod:`~gpuclust.report.draw.svg_writer` and
:mod:`~gpuclust.report.draw.png_writer` (the primitives as SVG or PNG),
:mod:`~gpuclust.report.draw.ticks` (tick positions and labels), :mod:`~gpuclust.report.draw.text`
(text measurement and wrapping), :mod:`~gpuclust.report.draw.style` (colours, sizes, viridis) and
:mod:`~gpuclust.report.draw.tables` (result table columns, Arrow or pandas).
"""

from gpuclust.report.draw.axes import Axes
from gpuclust.report.draw.figure import Figure
from gpuclust.report.draw.style import COLORS
from gpuclust.report.draw.style import viridis as viridis
from gpuclust.report.draw.tables import first, numbers, strings
from gpuclust.report.draw.tables import names_of as names_of
from gpuclust.report.draw.text import text_width as text_width
from gpuclust.report.draw.text import wrap as wrap
from gpuclust.report.draw.ticks import nice_ticks

__all__ = ["COLORS", "Axes", "Figure", "first", "nice_ticks", "numbers", "strings"]
