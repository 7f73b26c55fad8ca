"""Before/after: two analysed sessions compared (`xdiag diff`): sessions.py computes, outputs.py reads an analysis
back, html.py writes diff.html and diff.json."""
