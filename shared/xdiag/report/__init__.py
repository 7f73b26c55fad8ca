"""The report: `render_summary_html(analysis, results)` -> one self-contained summary.html.

Inline CSS and inline SVG charts only (no scripts, fonts, images or network links), so the
file opens anywhere, from a bucket or a mail attachment, and prints cleanly.
"""

from xdiag.report.render import render_summary_html

__all__ = ["render_summary_html"]
