"""A schedule rule: a way to schedule a PrimFunc, and the analysis that says whether it fits one.

As in TVM's dlight (``tvm.s_tir.dlight.ScheduleRule``): ``apply(func, target, tunable)`` returns
None when the rule does not fit the function, and an ordered list of rules (``FirstFit``) takes
the first that does. Unlike dlight's, ``apply`` returns the scheduled IRModule (a rule may end by
handing the function to dlight's own pass, which gives a module), and a rule says *why* it does
not fit (``why_not``), so that a family naming a rule that does not fit its function gets an
error saying so instead of another schedule.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ScheduleRule", "FirstFit"]


class ScheduleRule:
    """``schedule(sch, target)`` schedules ``sch`` in place and returns the IRModule, or None
    when it finds, part way, that it does not fit (the next rule of a ``FirstFit`` then starts
    from the unscheduled function); ``misfit(sch)`` is the analysis done first: None when the
    rule fits the function, else why not (a phrase that completes "does not fit: ...")."""

    def __init__(self, name: str, schedule: Callable, misfit: Callable | None = None):
        self.name = name
        self._schedule = schedule
        self._misfit = misfit

    def __repr__(self) -> str:
        return f"<ScheduleRule {self.name}>"

    def why_not(self, sch) -> str | None:
        """None when the rule fits the function ``sch`` holds, else the reason it does not."""
        return None if self._misfit is None else self._misfit(sch)

    def schedule(self, sch, target):
        """Schedule a function the rule fits (``why_not`` is None); -> IRModule, or None."""
        return self._schedule(sch, target)

    def apply(self, func, target, tunable: bool = False):
        """The scheduled IRModule of ``func``, or None when the rule does not fit it (no rule
        here has tunable instructions: ``tunable`` changes nothing)."""
        from tvm import s_tir
        sch = s_tir.Schedule(func)
        if self.why_not(sch) is not None:
            return None
        return self.schedule(sch, target)


class FirstFit(ScheduleRule):
    """An ordered list of rules: the first that fits schedules, each trying from the function
    as it was given (a rule that gives up part way leaves a partly scheduled copy behind)."""

    def __init__(self, name: str, rules):
        self.rules = tuple(rules)
        super().__init__(name, self._first, self._none_fits)

    def _none_fits(self, sch):
        reasons = [r.why_not(sch) for r in self.rules]
        if all(reasons):
            return "; ".join(f"{r.name}: {why}" for r, why in zip(self.rules, reasons))
        return None

    def _first(self, sch, target):
        from tvm import s_tir
        original = sch.mod
        for i, rule in enumerate(self.rules):
            here = sch if i == 0 else s_tir.Schedule(original)
            if rule.why_not(here) is not None:
                continue
            mod = rule.schedule(here, target)
            if mod is not None:
                return mod
        return None
