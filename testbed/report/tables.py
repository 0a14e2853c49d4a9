"""The paper's table layouts (Table 2, D.1-D.9, H.1, F.1, G.1, the artifact tier), the
explainable-cost table, stall measured against stall predicted from counted rounds and
the budgeted-validation frontier, built from a campaign's results.

Every builder returns the tables the campaign can fill (possibly none): a layout is
written only when the campaign holds the cells it compares. A campaign of single-action
trials gets its study's table only, a command workload its own
(``testbed.report.tables_command``); every kind gets the history checker's table when its
episodes were judged (``testbed.report.tables_history``). See docs/reports.md for how to
read each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.report.budget import budget_tables
from testbed.report.load import Run
from testbed.report.table_common import Options
from testbed.report.tables_command import COMMAND_KIND, command_tables
from testbed.report.tables_costs import artifact_tables, batch_tables, cost_tables
from testbed.report.tables_decomposition import decomposition_tables
from testbed.report.tables_history import history_tables
from testbed.report.tables_live import live_tables
from testbed.report.tables_policy import policy_tables, sync_tables
from testbed.report.tables_study import (
    density_tables,
    keyspace_tables,
    offset_tables,
    rate_tables,
    reuse_tables,
    sensitivity_tables,
)
from testbed.report.tables_trials import handoff_tables, replanning_tables, trial_kind
from testbed.report.tabular import Table

__all__ = ["BUILDERS", "COMMAND_BUILDERS", "TRIAL_BUILDERS", "build_tables"]


BUILDERS: Sequence[Callable[[Run, Options], list[Table]]] = (
    policy_tables,
    sync_tables,
    sensitivity_tables,
    keyspace_tables,
    density_tables,
    rate_tables,
    offset_tables,
    reuse_tables,
    batch_tables,
    artifact_tables,
    cost_tables,
    decomposition_tables,
    budget_tables,
    history_tables,
)
TRIAL_BUILDERS: Sequence[Callable[[Run, Options], list[Table]]] = (
    replanning_tables,
    handoff_tables,
    live_tables,
    history_tables,
)


COMMAND_BUILDERS: Sequence[Callable[[Run, Options], list[Table]]] = (command_tables,
                                                                     history_tables)


def build_tables(run: Run, *, draws: int, seed: int) -> list[Table]:
    options = Options(draws=draws, seed=seed)
    kind = trial_kind(run)
    builders = (BUILDERS if kind == "episodes" else COMMAND_BUILDERS if kind == COMMAND_KIND
                else TRIAL_BUILDERS)
    return [table for builder in builders for table in builder(run, options)]
