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
    """Counts consecutive evaluations crossing any rule; ``tripped`` once the count
    reaches ``patience`` with ``action: stop``."""

    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self.streak = 0
        self.tripped: dict | None = None  # {iteration, rules} of the stop

    def observe(self, row: dict) -> dict:
        """The row's guard entries (none when the guard is off or the row has no
        evaluation): ``guard/crossed`` (rules crossed now) and ``guard/streak``, and
        ``guard/stop`` 1 on the iteration it stops at."""
        if self.cfg.action == "off" or not is_evaluation_row(row):
            return {}
        now = [rule.describe() for rule in self.cfg.rules if crossed(rule, row)]
        self.streak = self.streak + 1 if now else 0
        out = {"guard/crossed": len(now), "guard/streak": self.streak}
        if self.streak >= self.cfg.patience and self.tripped is None:
            self.tripped = {"iteration": row["iteration"], "rules": now}
            out["guard/stop"] = 1
        return out

    def replay(self, rows: list[dict]) -> None:
        """Where a resumed run's streak stands after its recorded rows."""
        for row in rows:
            if "guard/streak" in row:
                self.streak = int(row["guard/streak"])
            if row.get("guard/stop"):
                self.tripped = {"iteration": row["iteration"], "rules": []}

    def replayed(self, rows: list[dict]) -> list[dict]:
        """What the rules say of each evaluation of a finished or running run, whatever
        its ``action`` (the run report's and the hacking study's reading):
        [{iteration, crossed: [rule, ...], streak, trips}], ``trips`` true at the
        evaluation where ``action: stop`` would have stopped the run (the first only)."""
        out, streak, tripped = [], 0, False
        for row in rows:
            if not is_evaluation_row(row):
                continue
            now = [rule.describe() for rule in self.cfg.rules if crossed(rule, row)]
            streak = streak + 1 if now else 0
            trips = not tripped and streak >= self.cfg.patience
            tripped = tripped or trips
            out.append(
                {"iteration": row["iteration"], "crossed": now, "streak": streak, "trips": trips}
            )
        return out

    def message(self) -> str:
        t = self.tripped or {}
        return (
            f"train.guard stopped the run after iteration {t.get('iteration')}: "
            f"{'; '.join(t.get('rules') or ['(recorded)'])} at {self.cfg.patience} "
            "evaluations in a row (eval/<signal>/delta rows, samples/ grids)"
        )
