"""The paper's table layouts (Table 2, D.1-D.7, D.9, H.1) built from a campaign's results.

Every builder returns the tables the campaign can fill (possibly none): a layout is
written only when the campaign holds the cells it compares. See docs/reports.md for how
to read each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.report.load import Run
from testbed.report.table_common import Options
from testbed.report.tables_policy import policy_tables, sync_tables
from testbed.report.tables_study import (
    density_tables,
    keyspace_tables,
    offset_tables,
    rate_tables,
    reuse_tables,
    sensitivity_tables,
)
from testbed.report.tabular import Table

__all__ = ["BUILDERS", "build_tables"]


BUILDERS: Sequence[Callable[[Run, Options], list[Table]]] = (
    policy_tables,
    sync_tables,
    sensitivity_tables,
    keyspace_tables,
    density_tables,
    rate_tables,
    offset_tables,
    reuse_tables,
)


def build_tables(run: Run, *, draws: int, seed: int) -> list[Table]:
    options = Options(draws=draws, seed=seed)
    return [table for builder in BUILDERS for table in builder(run, options)]
