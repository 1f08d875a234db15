"""``train.guard``: at every evaluation, which of its rules the run crosses (image
health, reward drift), and the stop once one has been crossed at ``patience``
evaluations in a row. Pure: it reads metrics rows, so a resumed run replays its
rows to know where its streak stands."""

from __future__ import annotations

from .config_guard import GuardConfig, GuardRule


def is_evaluation_row(row: dict) -> bool:
    """The row of an iteration that evaluated (its evaluation's entries are in it)."""
    return any(k.startswith("eval/") and not k.startswith("eval_") for k in row)


def crossed(rule: GuardRule, row: dict) -> bool:
    """Whether ``row``'s evaluation crosses ``rule``; a signal the row lacks (the first
    evaluation has no change yet) is not crossed."""
    key = f"eval/{rule.signal}"
    if rule.rises_by is not None:
        lo = row.get(f"{key}/delta_lo")
        return lo is not None and lo > rule.rises_by
    if rule.falls_by is not None:
        hi = row.get(f"{key}/delta_hi")
        return hi is not None and hi < -rule.falls_by
    value = row.get(key)
    if value is None:
        return False
    return value > rule.above if rule.above is not None else value < rule.below


class Guard:
    """Counts, rule by rule, the consecutive evaluations that cross it; ``tripped`` once
    one rule has been crossed at ``patience`` evaluations in a row with ``action: stop``
    (two rules crossed at alternate evaluations are two streaks of one)."""

    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self.streaks = {rule.describe(): 0 for rule in cfg.rules}
        self.tripped: dict | None = None  # {iteration, rules} of the stop

    def _read(self, row: dict) -> tuple[list[str], int]:
        """The rules ``row`` crosses, and the longest streak after it."""
        now = [rule.describe() for rule in self.cfg.rules if crossed(rule, row)]
        for name in self.streaks:
            self.streaks[name] = self.streaks[name] + 1 if name in now else 0
        return now, max(self.streaks.values(), default=0)

    def _trip(self, row: dict) -> None:
        held = [name for name, n in self.streaks.items() if n >= self.cfg.patience]
        self.tripped = {"iteration": row["iteration"], "rules": held}

    def observe(self, row: dict) -> dict:
        """The row's guard entries (none when the guard is off or the row has no
        evaluation): ``guard/crossed`` (rules crossed now) and ``guard/streak`` (the
        longest run of one rule), and ``guard/stop`` 1 on the iteration it stops at."""
        if self.cfg.action == "off" or not is_evaluation_row(row):
            return {}
        now, streak = self._read(row)
        out = {"guard/crossed": len(now), "guard/streak": streak}
        if streak >= self.cfg.patience and self.tripped is None:
            self._trip(row)
            out["guard/stop"] = 1
        return out

    def replay(self, rows: list[dict]) -> None:
        """Where a resumed run stands after its recorded rows, read with the rules it
        has now (a run resumed with ``action: off`` is never tripped; one resumed with
        rules it had crossed stops before its next iteration)."""
        for row in rows:
            if not is_evaluation_row(row):
                continue
            _, streak = self._read(row)
            if self.cfg.action == "stop" and streak >= self.cfg.patience and not self.tripped:
                self._trip(row)

    def replayed(self, rows: list[dict]) -> list[dict]:
        """What the rules say of each evaluation of a finished or running run, whatever
        its ``action`` (the run report's and the hacking study's reading):
        [{iteration, crossed: [rule, ...], streak, trips}], ``trips`` true at the
        evaluation where ``action: stop`` would have stopped the run (the first only)."""
        fresh, out, tripped = Guard(self.cfg), [], False
        for row in rows:
            if not is_evaluation_row(row):
                continue
            now, streak = fresh._read(row)
            trips = not tripped and streak >= self.cfg.patience
            tripped = tripped or trips
            it = row["iteration"]
            out.append({"iteration": it, "crossed": now, "streak": streak, "trips": trips})
        return out

    def message(self) -> str:
        t = self.tripped or {}
        return (
            f"train.guard stopped the run after iteration {t.get('iteration')}: "
            f"{'; '.join(t.get('rules') or ['(recorded)'])} at {self.cfg.patience} "
            "evaluations in a row (eval/<signal>/delta rows, samples/ grids)"
        )
