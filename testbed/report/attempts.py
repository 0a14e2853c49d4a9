"""Attempts in a report: one verdict row per episode, and which attempts were disturbed.

Rules this module obeys (the run directory keeps every attempt; nothing here changes it):

1. A run may hold several attempts of an episode (``attempt`` 1 upward, ``repeat`` 1..R;
   testbed/run/attempts.py). Rows written before attempts existed are attempt 1,
   repeat 1, and not disturbed (their ``disturbed`` is null: never measured).
2. The verdict of a repeat is its first undisturbed attempt, else its first attempt;
   an attempt aborted by the infrastructure (``testbed.results.aborts``: its model
   endpoint gave no answer; ``--resume`` ran it again) is the verdict only when the
   repeat has no other.
   An episode with one repeat is that attempt's row. With several repeats its costs
   (every numeric measurement) are the median over its repeats that did not abort, its
   action counts (scheduled, available, invalid, valid) are summed over the repeats,
   it is aborted only when every repeat aborted and disturbed when any repeat is.
3. ``exclude_disturbed`` drops disturbed attempts before rule 2; an episode none of
   whose attempts is left is then missing from every table (and so is any pair it
   belonged to). How many attempts and episodes were dropped is returned, and the
   report says it.
4. Action rows follow their episode's verdict attempts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from testbed.results.aborts import retried_on_resume
from testbed.results.schema import CELL_COLUMNS, STUDY_COLUMNS
from testbed.results.verdict import BUSY_PCT, RESOLUTION

#: Summed over repeats (rule 2).
SUM_COLUMNS = ("scheduled", "available", "invalid_n", "valid", "recorded",
               "scheduled_actions", "attempted_actions")
#: Identity and setting columns: the same in every attempt of an episode.
FIXED_COLUMNS = frozenset((*CELL_COLUMNS, *STUDY_COLUMNS, "episode", "family", "template",
                           "schedule_digest", "seed", "updates", "attempt", "repeat"))


@dataclass(frozen=True)
class Collapsed:
    episodes: pd.DataFrame  # one row per episode (rule 2)
    actions: pd.DataFrame  # the verdict attempts' actions (rule 4)
    attempts: pd.DataFrame  # every attempt as recorded, with ``verdict`` marking rule 2
    excluded_attempts: int
    excluded_episodes: int


def with_attempt_columns(frame: pd.DataFrame, *, episodes: bool = True) -> pd.DataFrame:
    """``attempt`` and ``repeat`` filled with 1 and, in episode rows, ``disturbed`` with
    False (rule 1)."""
    out = frame.copy()
    for column in ("attempt", "repeat") if episodes else ("attempt",):
        values = out[column] if column in out else pd.Series(1, index=out.index)
        out[column] = pd.to_numeric(values).fillna(1).astype(int)
    if episodes:
        values = out["disturbed"] if "disturbed" in out else pd.Series(False, index=out.index)
        out["disturbed"] = values.astype("boolean").fillna(False).astype(bool)
    return out


def collapse(episodes: pd.DataFrame, actions: pd.DataFrame, *,
             exclude_disturbed: bool = False) -> Collapsed:
    """Rules 2-4 over episode rows that carry per-attempt action counts."""
    attempts = with_attempt_columns(episodes)
    actions = with_attempt_columns(actions, episodes=False)
    kept = attempts[~attempts["disturbed"]] if exclude_disturbed else attempts
    excluded_attempts = len(attempts) - len(kept)
    excluded_episodes = attempts["episode"].nunique() - kept["episode"].nunique()
    infra = (kept["aborted"].astype(bool) & kept["abort_reason"].map(retried_on_resume)
             if "abort_reason" in kept and "aborted" in kept
             else pd.Series(False, index=kept.index))
    order = kept.assign(_infra=infra).sort_values(
        ["episode", "repeat", "_infra", "disturbed", "attempt"], kind="stable")
    verdicts = order.drop_duplicates(["episode", "repeat"], keep="first").drop(
        columns=["_infra"])
    chosen = set(zip(verdicts["episode"], verdicts["attempt"], strict=True))
    attempts = attempts.assign(verdict=[(e, a) in chosen for e, a in
                                        zip(attempts["episode"], attempts["attempt"],
                                            strict=True)])
    counts = attempts.groupby("episode")["attempt"].count().rename("attempts")
    if verdicts["episode"].is_unique:
        rows = verdicts
    else:
        rows = pd.DataFrame([_merge_repeats(group) for _, group in
                             verdicts.groupby("episode", sort=False)])
    rows = rows.drop(columns=["attempts"], errors="ignore").merge(
        counts, left_on="episode", right_index=True, how="left")
    rows = rows.reset_index(drop=True)
    if "attempt" in actions and not actions.empty:
        mask = [(e, a) in chosen for e, a in zip(actions["episode"], actions["attempt"],
                                                  strict=True)]
        actions = actions[mask]
    return Collapsed(rows, actions.reset_index(drop=True), attempts, excluded_attempts,
                     excluded_episodes)


def _merge_repeats(group: pd.DataFrame) -> pd.Series:
    """One episode's repeats as one row (rule 2)."""
    group = group.sort_values("repeat")
    row = group.iloc[0].copy()
    done = group[~group["aborted"].astype(bool)] if "aborted" in group else group
    for column in group.columns:
        if column in FIXED_COLUMNS or column in ("aborted", "disturbed", "verdict"):
            continue
        if column in SUM_COLUMNS:
            row[column] = group[column].sum()
        elif pd.api.types.is_numeric_dtype(group[column]) \
                and not pd.api.types.is_bool_dtype(group[column]):
            row[column] = done[column].median() if not done.empty else float("nan")
    if "aborted" in group:
        row["aborted"] = bool(group["aborted"].astype(bool).all())
    row["disturbed"] = bool(group["disturbed"].any())
    if "disturbed_reason" in group:
        reasons = [str(r) for r in group["disturbed_reason"].dropna() if str(r)]
        row["disturbed_reason"] = "; ".join(dict.fromkeys(reasons))
    row["repeats"] = len(group)
    return row


def disturbed_summary(attempts: pd.DataFrame, excluded: tuple[int, int] | None) -> str:
    """One line for the top of a report: how many episodes were disturbed, what it means."""
    if "disturbed" not in attempts or "node_runq_wait_ms" not in attempts \
            or attempts["node_runq_wait_ms"].isna().all():
        return ("Disturbance: not measured in this run (recorded before it was), so nothing "
                "says whether the host moved a stall.")
    measured = attempts[attempts["node_runq_wait_ms"].notna()]
    episodes = measured["episode"].nunique()
    flagged = measured[measured["disturbed"]]["episode"].nunique()
    if flagged == 0:
        return (f"Disturbance: none of {episodes} measured episodes was disturbed: the host "
                f"could not have moved any stall by more than {RESOLUTION:.0%}.")
    if excluded is not None:
        use = (f"--exclude-disturbed left {excluded[0]} disturbed attempts out of every "
               "table and figure")
    else:
        use = ("they are in every table and figure (testbed report --exclude-disturbed "
               "leaves them out)")
    return (f"Disturbance: {flagged} of {episodes} measured episodes were disturbed: the "
            f"host's contention could have moved their stall by more than {RESOLUTION:.0%} "
            "(the run's resolution), so a comparison that rests on them is less sure than "
            f"its interval says; {use}. Details at the end.")


def disturbed_lines(attempts: pd.DataFrame, excluded: tuple[int, int] | None) -> list[str]:
    """The report's lines on disturbance: disturbed attempts per cell (rule 3's counts)."""
    if "disturbed" not in attempts or "node_runq_wait_ms" not in attempts \
            or attempts["node_runq_wait_ms"].isna().all():
        return ["No disturbance measurements in this run (recorded before they existed)."]
    lines = []
    flagged = attempts[attempts["disturbed"]]
    measured = attempts["node_runq_wait_ms"].notna().sum()
    lines.append(f"Disturbed means the host's contention could have moved an episode's stall "
                 f"by more than the run's resolution ({RESOLUTION:.0%}; docs/campaigns.md, "
                 f"\"Disturbance\"): {len(flagged)} of {measured} measured attempts.")
    if "disturbance_bound_pct" in attempts and attempts["disturbance_bound_pct"].notna().any():
        worst = attempts.groupby("cell")["disturbance_bound_pct"].median().dropna()
        if not worst.empty:
            lines.append(f"How far the host could have moved a cell's stall (median over its "
                         f"attempts): at most {worst.max():.1f}% ({worst.idxmax()}), "
                         f"{worst.median():.1f}% in the median cell.")
    if "host_busy_pct" in attempts and attempts["host_busy_pct"].notna().any():
        busy = int((attempts["host_busy_pct"] > BUSY_PCT).sum())
        lines.append(f"For information, not a verdict: the host's CPUs were more than "
                     f"{BUSY_PCT:.0f}% busy during {busy} of "
                     f"{int(attempts['host_busy_pct'].notna().sum())} attempts (median "
                     f"{attempts['host_busy_pct'].median():.0f}%).")
    if flagged.empty:
        lines.append(f"No attempt was disturbed ({measured} measured): nothing the host did "
                     "could have moved a stall beyond the resolution.")
    else:
        lines.append(f"DISTURBED {len(flagged)} of {measured} attempts "
                     f"({flagged['episode'].nunique()} episodes); per cell:")
        for cell, part in flagged.groupby("cell", sort=True):
            names = ", ".join(f"{t}#{a}" for t, a in zip(part["template"], part["attempt"],
                                                        strict=True))
            lines.append(f"{cell}: {len(part)} disturbed ({names})")
        reasons = flagged["disturbed_reason"].fillna("").astype(str).str.split(" ").str[0]
        lines.append("Disturbed by: " + "; ".join(f"{r} ({n})" for r, n in
                                                  reasons.value_counts().items()) + ".")
    reruns = len(attempts) - len(attempts.drop_duplicates(["episode", "repeat"]))
    if reruns:
        lines.append(f"{reruns} attempts are reruns of a disturbed attempt (--rerun-disturbed);"
                     " each repeat's verdict is its first undisturbed attempt, else its first.")
    if excluded is not None:
        lines.append(f"--exclude-disturbed: {excluded[0]} disturbed attempts left out of every "
                     f"table; {excluded[1]} episodes had no undisturbed attempt and are "
                     "missing (with the pairs they belong to).")
    return lines
