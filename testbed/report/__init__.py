"""Reports from campaign results: the paper's tables, paired statistics, figures.

Layers (each imports only those above it): ``naming`` (policy names and categories),
``load`` (run directory -> frames), ``stats`` (medians, IQR, two-stage bootstrap, tie
rule), ``slicing`` (which slice a table shows), ``tabular`` (table model and writers),
``tables`` and ``figures`` (the layouts), ``render`` (report.md/html), ``build``
(``build_report``, the entry point). This package module imports none of them.
"""

from pathlib import Path

#: The shipped per-episode spread table (testbed.report.spread reads and writes it); here,
#: so the command line names it without importing numpy.
SPREAD_TABLE = Path(__file__).with_name("spread.json")
