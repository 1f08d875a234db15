"""``train.guard``: at every evaluation, which of its rules the run crosses (image
health, reward drift), the alarm once one has been crossed at ``patience`` evaluations
in a row, and the last evaluation at which none was (the healthy checkpoint's). Pure: it
reads metrics rows, so a resumed run replays its rows to know where its streak stands."""

from __future__ import annotations

from ..config.guard import GuardConfig, GuardRule
from ..config.guard_defaults import default_rules

# why a signal may be absent from every evaluation, said once when a rule lacks it
MISSING_WHY = {
    "health/diversity": "train.eval.per_prompt is 1: it needs 2 samples a prompt or more",
    "health/diversity_embed": "train.eval.per_prompt is 1, or no served scorer gives an "
    "image embedding",
    "drift/": "no held-out scorer: train.reward.scorers serves only the trained rewards "
    "(serve another, e.g. clip_score beside hpsv2)",
}


def is_evaluation_row(row: dict) -> bool:
    """The row of an iteration that evaluated (its evaluation's entries are in it)."""
    return any(k.startswith("eval/") and not k.startswith("eval_") for k in row)


def has_signal(rule: GuardRule, row: dict) -> bool:
    """Whether an evaluation row records ``rule``'s signal at all. The run's first
    evaluation (no change since anything yet) lacks the drift and has the measures' means
    only: nothing is missing there."""
    first = not any(k.endswith("/delta") for k in row)
    return first or f"eval/{rule.signal}" in row


def directed_bound(row: dict, signal: str, test: str) -> float | None:
    """What a test compares with its threshold, turned so that larger is worse: the 95%
    CI bound of the change since the first evaluation in the test's direction (``lo`` for
    a rise, ``−hi`` for a fall), or the evaluation's mean (``−mean`` for ``below``); None
    where the row lacks it (the first evaluation has no change)."""
    key = f"eval/{signal}"
    if test in ("above", "below"):
        value = row.get(key)
        return None if value is None else (value if test == "above" else -value)
    rises = test.startswith("rises")
    bound = row.get(f"{key}/delta_lo" if rises else f"{key}/delta_hi")
    return None if bound is None else (bound if rises else -bound)


def base_mean(row: dict, signal: str) -> float:
    """The first evaluation's mean of ``signal`` (the paired change of the mean is the
    change of the means), as a magnitude: what the relative tests scale by."""
    key = f"eval/{signal}"
    return abs(row[key] - row[f"{key}/delta"])


def crossed(rule: GuardRule, row: dict) -> bool:
    """Whether ``row``'s evaluation crosses ``rule``; a signal the row lacks (the first
    evaluation has no change yet) is not crossed (``has_signal`` tells the two apart)."""
    bound = directed_bound(row, rule.signal, rule.test)
    if bound is None:
        return False
    if rule.test.endswith("_rel"):
        return bound > rule.threshold * base_mean(row, rule.signal)
    return bound > (-rule.threshold if rule.test == "below" else rule.threshold)


def missing_reason(rule: GuardRule) -> str:
    why = next((w for k, w in MISSING_WHY.items() if rule.signal.startswith(k)), None)
    return why or "no evaluation records it (a scorer or measure this run lacks)"


class Guard:
    """Counts, rule by rule, the consecutive evaluations that cross it; ``tripped`` once
    one rule has been crossed at ``patience`` evaluations in a row (two rules crossed at
    alternate evaluations are two streaks of one). ``stops``: tripped with ``action:
    stop``. ``last_healthy``: the last evaluation's iteration at which no rule was
    crossed. ``say`` hears each rule without a signal once, and the trip."""

    def __init__(self, cfg: GuardConfig, say=None) -> None:
        self.cfg = cfg
        # a config read outside a train section has none: the tiny world's
        self.rules = cfg.rules if cfg.rules is not None else default_rules()
        self.streaks = {rule.describe(): 0 for rule in self.rules}
        self.tripped: dict | None = None  # {iteration, rules, last_healthy} of the alarm
        self.last_healthy: int | None = None
        self.missing_said: set[str] = set()
        self.say = say or (lambda message: None)

    @property
    def stops(self) -> bool:
        return self.tripped is not None and self.cfg.action == "stop"

    def _read(self, row: dict) -> tuple[list[str], int]:
        """The rules ``row`` crosses, and the longest streak after it."""
        now = [rule.describe() for rule in self.rules if crossed(rule, row)]
        for name in self.streaks:
            self.streaks[name] = self.streaks[name] + 1 if name in now else 0
        if not now:
            self.last_healthy = row["iteration"]
        return now, max(self.streaks.values(), default=0)

    def _trip(self, row: dict) -> None:
        held = [name for name, n in self.streaks.items() if n >= self.cfg.patience]
        self.tripped = {
            "iteration": row["iteration"],
            "rules": held,
            "last_healthy": self.last_healthy,
        }

    def _missing(self, row: dict) -> list[str]:
        gone = [rule for rule in self.rules if not has_signal(rule, row)]
        for rule in gone:
            if rule.describe() not in self.missing_said:
                self.missing_said.add(rule.describe())
                self.say(
                    f"train.guard: rule {rule.describe()!r} has no signal (eval/{rule.signal} "
                    f"is not recorded): {missing_reason(rule)}; it can never alarm"
                )
        return [rule.describe() for rule in gone]

    def observe(self, row: dict) -> dict:
        """The row's guard entries (none when the guard is off or the row has no
        evaluation): ``guard/crossed`` (rules crossed now), ``guard/streak`` (the longest
        run of one rule), ``guard/missing`` (rules whose signal the row lacks),
        ``guard/rule/<rule>`` 1 or 0 for each rule with a signal, ``guard/missing/<rule>``
        1 for each without, ``guard/tripped`` 1 from the alarm on, and ``guard/alert``
        (``guard/stop`` under ``action: stop``) 1 at the evaluation that raised it."""
        if self.cfg.action == "off" or not is_evaluation_row(row):
            return {}
        missing = self._missing(row)
        now, streak = self._read(row)
        out = {"guard/crossed": len(now), "guard/streak": streak, "guard/missing": len(missing)}
        for rule in self.rules:
            name = rule.describe()
            if name in missing:
                out[f"guard/missing/{name}"] = 1
            else:
                out[f"guard/rule/{name}"] = int(name in now)
        if streak >= self.cfg.patience and self.tripped is None:
            self._trip(row)
            out["guard/stop" if self.cfg.action == "stop" else "guard/alert"] = 1
            self.say(self.message())
        if self.tripped is not None:
            out["guard/tripped"] = 1
        return out

    def replay(self, rows: list[dict]) -> None:
        """Where a resumed run stands after its recorded rows, read with the rules it
        has now (a run resumed with ``action: off`` is never tripped; one resumed with
        ``stop`` and rules it had crossed stops before its next iteration)."""
        for row in rows:
            if not is_evaluation_row(row):
                continue
            _, streak = self._read(row)
            if self.cfg.action != "off" and streak >= self.cfg.patience and not self.tripped:
                self._trip(row)

    def replayed(self, rows: list[dict]) -> list[dict]:
        """What the rules say of each evaluation of a finished or running run, whatever
        its ``action`` (the run report's and the hacking study's reading):
        [{iteration, crossed: [rule, ...], streak, held: [rule, ...], trips}], ``held`` the
        rules crossed at ``patience`` evaluations in a row there, ``trips`` true at the
        evaluation where the guard would have raised its alarm (the first only)."""
        fresh, out, tripped = Guard(self.cfg), [], False
        for row in rows:
            if not is_evaluation_row(row):
                continue
            now, streak = fresh._read(row)
            trips = not tripped and streak >= self.cfg.patience
            tripped = tripped or trips
            held = [n for n, s in fresh.streaks.items() if s >= self.cfg.patience]
            it = row["iteration"]
            out.append(
                {"iteration": it, "crossed": now, "streak": streak, "held": held, "trips": trips}
            )
        return out

    def message(self) -> str:
        t = self.tripped or {}
        what = "stopped the run" if self.cfg.action == "stop" else "raised its alarm"
        healthy = t.get("last_healthy")
        keep = (
            f"; the last healthy evaluation was iteration {healthy} (healthy.json; "
            "`g2rpo export RUN --checkpoint healthy` writes its checkpoint's weights)"
            if healthy is not None
            else "; no evaluation was healthy"
        )
        return (
            f"train.guard {what} after iteration {t.get('iteration')}: "
            f"{'; '.join(t.get('rules') or ['(recorded)'])} at {self.cfg.patience} "
            f"evaluations in a row (eval/<signal>/delta rows, samples/ grids){keep}"
        )
