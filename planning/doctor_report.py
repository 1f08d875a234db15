"""What ``g2rpo doctor`` reports: each phase's verdict, time, memory and figures,
as data (``--json``) and as a table."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PhaseResult(BaseModel):
    phase: str
    ok: bool | None = Field(None, description="None: skipped")
    seconds: float = 0.0
    peak_gib: float | None = Field(None, description="the actor's peak device memory (CUDA)")
    plan_gib: float | None = Field(None, description="the plan's estimate for that actor")
    details: dict = Field(default_factory=dict)
    error: str | None = None
    field: str | None = None


class DoctorReport(BaseModel):
    config: str
    device: str
    architecture: str
    phases: list[PhaseResult]

    @property
    def ok(self) -> bool:
        return all(p.ok is not False for p in self.phases)

    def first_failure(self) -> PhaseResult | None:
        return next((p for p in self.phases if p.ok is False), None)


def format_report(rep: DoctorReport) -> str:
    def num(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = [
        f"g2rpo doctor {rep.config} on {rep.device} ({rep.architecture})",
        f"{'phase':<15} {'result':<7} {'seconds':>8} {'peak GiB':>9} {'plan GiB':>9}  details",
    ]
    for p in rep.phases:
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[p.ok]
        shown = {k: v for k, v in p.details.items() if k not in ("allocated_before_gib",)}
        detail = ", ".join(f"{k} {v}" for k, v in shown.items())
        if p.error:
            detail = p.error + (f" [look at {p.field}]" if p.field else "")
        lines.append(
            f"{p.phase:<15} {verdict:<7} {p.seconds:>8.2f} {num(p.peak_gib):>9} "
            f"{num(p.plan_gib):>9}  {detail}"
        )
    bad = rep.first_failure()
    lines.append(
        "all phases passed"
        if bad is None
        else f"FAILED at phase {bad.phase!r}" + (f": look at {bad.field}" if bad.field else "")
    )
    return "\n".join(lines)
