"""The paper's table cells as data: ``paper_numbers.csv``, its checks and references.

``paper_numbers.csv`` (beside this module, shipped in the wheel) holds every numeric
cell of the paper's result tables that a study can be compared with, one line per cell:

``table``
    the paper's table (:data:`TABLES`: ``1a``, ``1b``, ``2``, ``C.2``, ``D.1`` ...
    ``D.10``, ``F.1``, ``G.1``, ``H.1``).
``row``
    the paper's row written as the testbed settings it stands for, ``name=value`` pairs
    separated by spaces (``policy=metadata_sync/2 rho=0.25``); names from
    :data:`DIMENSIONS`, policy names from the policy registry.
``column``
    the statistic (:data:`COLUMNS`: ``stall``, ``traffic``, ``invalid/issued`` ...).
``value``
    the number as the paper prints it: a decimal (``230.8``, ``-24.9``) or a count out
    of a denominator (``29/30``); marks such as daggers are left out and said in
    ``note``.
``unit``
    the column's unit (``ms/action``, ``KiB/action``, ``count``, ``%``, ``ms/query``).
``note``
    optional, a few words of ours (what a mark meant, which offsets a row spans).

Lines starting with ``#`` are comments. :func:`load_paper` validates every line; a bad
one is a :class:`~testbed.errors.UserError` naming the line and the field. A claim
names a cell as ``table|row|column`` (:func:`reference_value`). Which cells a run
compares with: ``testbed/report/paper_map.py``; the report's table of them:
``testbed/report/paper_beside.py``.
"""

from __future__ import annotations

import ast
import csv
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from protocols.policies import describe_policy
from testbed.errors import UserError
from testbed.links.profiles import profile_names
from testbed.report import slicing
from testbed.report.tables_trials import SCENARIO_TITLES

PAPER_FILE = Path(__file__).with_name("paper_numbers.csv")
FIELDS = ("table", "row", "column", "value", "unit", "note")
#: The paper's tables the file may hold, in the paper's order.
TABLES: tuple[str, ...] = ("1a", "1b", "2", "C.2", "D.1", "D.2", "D.3", "D.4", "D.5", "D.6",
                           "D.7", "D.8", "D.9", "D.10", "F.1", "G.1", "H.1")

# --- the vocabulary of the file -----------------------------------------------------------

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FRACTION = re.compile(r"(\d+)/(\d+)")
_WORD = re.compile(r"[a-z][a-z0-9_]*")


def _float(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number; allowed: a decimal number") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a number; allowed: a decimal number")
    return slicing.number(number)


def _int(value: str) -> str:
    if not value.isdigit():
        raise ValueError(f"{value!r} is not allowed; allowed: a whole number")
    return str(int(value))


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"{value!r} is not allowed; allowed: {', '.join(allowed)}")
        return value
    return check


def _policy(value: str) -> str:
    describe_policy(value)  # ValueError: one line with the allowed names
    return value


def _network(value: str) -> str:
    return _choice(*profile_names())(value)


def _word(value: str) -> str:
    if not _WORD.fullmatch(value):
        raise ValueError(f"{value!r} is not allowed; allowed: a lower-case word (a-z, 0-9, _)")
    return value


#: Setting names a row may use, each with its check (which also normalises: ``4.0``
#: and ``4`` are the same rho). All but ``selector`` are result columns of a run.
DIMENSIONS: dict[str, Callable[[str], str]] = {
    "policy": _policy,
    "network": _network,
    "trace_offset_s": _float,
    "connection": _choice("fresh", "reuse", "reuse_warm"),
    "agents": _int,
    "keys": _int,
    "deps": _int,
    "rho": _float,
    "tier": _choice("compact", "artifact"),
    "units": _int,
    "batch": _int,
    "replan_delay_s": _float,
    "update_rate_per_s": _float,
    "update_target": _choice("relevant", "unrelated"),
    "scenario": _choice(*SCENARIO_TITLES),
    "executor_inputs": _choice("local", "fresh"),
    "selector": _word,  # D.10's selectors: no run holds them
}
NUMERIC = {name for name, check in DIMENSIONS.items() if check in (_float, _int)}

FRACTION, NUMBER = "fraction", "number"


@dataclass(frozen=True)
class Column:
    unit: str
    form: str  # FRACTION (n/m) or NUMBER
    title: str


#: The statistics a cell may hold: unit, written form and a short title.
COLUMNS: dict[str, Column] = {
    "stall": Column("ms/action", NUMBER, "stall"),
    "stall_q1": Column("ms/action", NUMBER, "stall, first quartile"),
    "stall_q3": Column("ms/action", NUMBER, "stall, third quartile"),
    "traffic": Column("KiB/action", NUMBER, "traffic"),
    "connections": Column("count", NUMBER, "connections per episode"),
    "invalid/issued": Column("count", FRACTION, "invalid / issued"),
    "available/scheduled": Column("count", FRACTION, "available / scheduled"),
    "valid/scheduled": Column("count", FRACTION, "valid / scheduled"),
    "planfence_vs_batched": Column("%", NUMBER, "PlanFence vs batched all-key"),
    "reduction": Column("%", NUMBER, "PlanFence's reduction vs batched all-key"),
    "detected": Column("count", FRACTION, "detected / scheduled"),
    "valid_completion/scheduled": Column("count", FRACTION, "valid completion / scheduled"),
    "complete/scheduled": Column("count", FRACTION, "complete / scheduled"),
    "block": Column("count", NUMBER, "block"),
    "infra": Column("count", NUMBER, "infra."),
    "gap": Column("count", NUMBER, "gap"),
    "task_success/scheduled": Column("count", FRACTION, "task success / scheduled"),
    "invalid_primary/scheduled": Column("count", FRACTION, "invalid primary / scheduled"),
    "successful_replans/scheduled": Column("count", FRACTION, "successful replans"),
    "redundant_auditor_actions": Column("count", NUMBER, "redundant auditor actions"),
    "correct_primary/scheduled": Column("count", FRACTION, "correct primary / scheduled"),
    "safe_near_optimal_id": Column("%", NUMBER, "safe near-optimal, in distribution"),
    "safe_near_optimal_ood": Column("%", NUMBER, "safe near-optimal, out of distribution"),
    "stall_regret_p95_id": Column("ms/action", NUMBER, "tail stall regret, in distribution"),
    "stall_regret_p95_ood": Column("ms/action", NUMBER,
                                   "tail stall regret, out of distribution"),
    "inference_p95": Column("ms/query", NUMBER, "tail inference"),
}


def parse_settings(text: str) -> tuple[tuple[str, str], ...]:
    """``name=value`` pairs separated by spaces, each checked and normalised; a
    ValueError names the pair that is wrong."""
    pairs: list[tuple[str, str]] = []
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"{item!r} is not allowed; allowed: name=value pairs "
                             "separated by spaces")
        if name not in DIMENSIONS:
            raise ValueError(f"{name!r} is not allowed; allowed: {', '.join(DIMENSIONS)}")
        if any(name == n for n, _ in pairs):
            raise ValueError(f"{name!r} is given twice")
        try:
            pairs.append((name, DIMENSIONS[name](value)))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if not pairs:
        raise ValueError("empty; allowed: name=value pairs separated by spaces")
    return tuple(pairs)



# --- the file ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PaperCell:
    """One cell of one of the paper's tables, as printed."""

    table: str
    row: tuple[tuple[str, str], ...]
    column: str
    value: str
    unit: str
    note: str = ""
    line: int = 0

    @property
    def row_text(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.row)

    @property
    def key(self) -> str:
        """``table|row|column``: how a claim names this cell."""
        return f"{self.table}|{self.row_text}|{self.column}"

    @property
    def is_fraction(self) -> bool:
        return COLUMNS[self.column].form == FRACTION

    @property
    def parts(self) -> tuple[float, float | None]:
        """The number, and for a count out of a denominator the denominator."""
        match = _FRACTION.fullmatch(self.value)
        if match:
            return float(match.group(1)), float(match.group(2))
        return float(self.value), None

    @property
    def number(self) -> float:
        """The printed number (a fraction's numerator)."""
        return self.parts[0]

    @property
    def share(self) -> float:
        """What a ratio compares: a fraction's share, or the number."""
        number, denominator = self.parts
        if denominator is None:
            return number
        return number / denominator if denominator else math.nan

    @property
    def decimals(self) -> int:
        return len(self.value.split(".", 1)[1]) if "." in self.value else 0

    def setting(self, name: str) -> str | None:
        return dict(self.row).get(name)


def _fail(where: str, line: int, field_name: str, message: str) -> UserError:
    return UserError(f"{where} line {line}: {field_name}: {message}")


def _check_value(column: str, value: str) -> str:
    form = COLUMNS[column].form
    if form == FRACTION:
        match = _FRACTION.fullmatch(value)
        if not match:
            raise ValueError(f"{value!r} is not allowed for column {column}; allowed: a "
                             "count out of a denominator, e.g. 29/30")
        if int(match.group(1)) > int(match.group(2)):
            raise ValueError(f"{value!r} is not allowed; allowed: a count no larger than "
                             "its denominator")
        return value
    if not _NUMBER.fullmatch(value):
        raise ValueError(f"{value!r} is not allowed for column {column}; allowed: a "
                         "decimal number as printed, e.g. 230.8 or -24.9")
    return value


def parse_paper(text: str, where: str = "paper numbers") -> list[PaperCell]:
    """Cells of a paper-numbers CSV text; a bad line is a UserError naming the line
    (1-based, comments counted) and the field."""
    cells: list[PaperCell] = []
    seen: dict[tuple[str, tuple[tuple[str, str], ...], str], int] = {}
    lines = text.splitlines()
    body = [(i + 1, line) for i, line in enumerate(lines)
            if line.strip() and not line.lstrip().startswith("#")]
    if not body:
        raise UserError(f"{where}: no header; allowed: a first line "
                        f"{','.join(FIELDS)} (note optional)")
    header_line, header = body[0]
    names = next(csv.reader([header]))
    if tuple(names) not in (FIELDS, FIELDS[:-1]):
        raise UserError(f"{where} line {header_line}: header: {','.join(names)!r} is not "
                        f"allowed; allowed: {','.join(FIELDS)} (note optional)")
    allowed = {len(FIELDS) - 1, len(names)}  # the note may be left out
    for number, line in body[1:]:
        values = next(csv.reader([line]))
        if len(values) not in allowed:
            raise UserError(f"{where} line {number}: {len(values)} fields; allowed: "
                            f"{' or '.join(map(str, sorted(allowed)))} "
                            f"({','.join(names)})")
        record = dict(zip(FIELDS, (v.strip() for v in values), strict=False))
        table = record["table"]
        if table not in TABLES:
            raise _fail(where, number, "table", f"{table!r} is not allowed; allowed: "
                        + ", ".join(TABLES))
        try:
            row = parse_settings(record["row"])
        except ValueError as exc:
            raise _fail(where, number, "row", str(exc)) from None
        column = record["column"]
        if column not in COLUMNS:
            raise _fail(where, number, "column", f"{column!r} is not allowed; allowed: "
                        + ", ".join(COLUMNS))
        try:
            value = _check_value(column, record["value"])
        except ValueError as exc:
            raise _fail(where, number, "value", str(exc)) from None
        unit = record["unit"]
        if unit != COLUMNS[column].unit:
            raise _fail(where, number, "unit", f"{unit!r} is not allowed for column "
                        f"{column}; allowed: {COLUMNS[column].unit}")
        identity = (table, tuple(sorted(row)), column)
        if identity in seen:
            raise _fail(where, number, "row", f"table {table}, row {record['row']!r}, "
                        f"column {column} is already given on line {seen[identity]}")
        seen[identity] = number
        cells.append(PaperCell(table, row, column, value, unit, record.get("note", ""),
                               number))
    return cells


def load_paper(path: Path | None = None) -> list[PaperCell]:
    """The cells of ``path`` (default: the shipped ``paper_numbers.csv``)."""
    if path is None:
        return list(shipped())
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return parse_paper(text, str(path))


@cache
def shipped() -> tuple[PaperCell, ...]:
    """The cells of the shipped file (read once)."""
    return tuple(parse_paper(PAPER_FILE.read_text(encoding="utf-8"), PAPER_FILE.name))


# --- claims: a reference to the paper's numbers ----------------------------------------

_REF = re.compile(r"\{([^{}]+)\}")
_OPS: dict[type[ast.AST], Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def lookup(key: str, cells: Sequence[PaperCell] | None = None) -> PaperCell:
    """The cell a ``table|row|column`` key names (the row's pairs in any order)."""
    table, sep, rest = key.partition("|")
    row_text, sep2, column = rest.rpartition("|")
    if not (sep and sep2):
        raise UserError(f"paper reference {key!r}: allowed: table|row|column")
    try:
        row = tuple(sorted(parse_settings(row_text)))
    except ValueError as exc:
        raise UserError(f"paper reference {key!r}: row: {exc}") from None
    for cell in cells if cells is not None else shipped():
        if cell.table == table.strip() and cell.column == column.strip() \
                and tuple(sorted(cell.row)) == row:
            return cell
    raise UserError(f"paper reference {key!r}: no such cell in {PAPER_FILE.name}")


def _sum(pattern: str, cells: Sequence[PaperCell]) -> float:
    """``sum:table|pairs|column``: the sum over the table's cells of that column whose
    rows hold every given pair."""
    table, _, rest = pattern.partition("|")
    row_text, _, column = rest.rpartition("|")
    wanted = set(parse_settings(row_text))
    found = [c.number for c in cells if c.table == table and c.column == column
             and wanted <= set(c.row)]
    if not found:
        raise UserError(f"paper reference 'sum:{pattern}': no cell matches")
    return float(sum(found))


def reference_value(ref: str, cells: Sequence[PaperCell] | None = None) -> float:
    """The number a claim's paper reference gives.

    A reference is a cell key (``2|policy=planfence|stall``: the printed number, a
    count's numerator) or arithmetic over keys in braces
    (``100 * ({2|policy=planfence|stall} / {2|policy=metadata_sync|stall} - 1)``).
    Inside braces, ``KEY#den`` is a count's denominator and ``sum:KEY`` the sum over the
    cells whose rows hold the key's pairs.
    """
    pool: Sequence[PaperCell] = cells if cells is not None else shipped()

    def one(key: str) -> float:
        key = key.strip()
        if key.startswith("sum:"):
            return _sum(key[4:], pool)
        if key.endswith("#den"):
            denominator = lookup(key[:-4], pool).parts[1]
            if denominator is None:
                raise UserError(f"paper reference {key!r}: the cell is not a count out "
                                "of a denominator")
            return denominator
        return lookup(key, pool).number

    if "{" not in ref:
        return one(ref)
    values: list[float] = []

    def slot(match: re.Match[str]) -> str:
        values.append(one(match.group(1)))
        return f"_v{len(values) - 1}"

    expression = _REF.sub(slot, ref)
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise UserError(f"paper reference {ref!r}: allowed: numbers, {{keys}}, + - * / "
                        "and parentheses") from None
    return _arith(tree.body, values, ref)


def _arith(node: ast.AST, values: list[float], ref: str) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id.startswith("_v"):
        return values[int(node.id[2:])]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand, values, ref)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left, values, ref),
                                   _arith(node.right, values, ref))
    raise UserError(f"paper reference {ref!r}: allowed: numbers, {{keys}}, + - * / and "
                    "parentheses")
