"""Custom schedule rules a task names but TVM does not have: the generic fallback, without TVM's warning.

TOPI marks some blocks with a ``schedule_rule`` annotation naming a custom MetaSchedule rule (a max pool's
block says ``meta_schedule.pool_max``), which MetaSchedule's ``ApplyCustomRule`` looks up as the global
function ``s_tir.meta_schedule.<target key>.<rule>`` when it builds a task's design space. TVM 0.27 has
none for the pooling rules (``pool_max``, ``pool_avg``, ``adaptive_pool_*``): ``ApplyCustomRule`` then
prints ``Unknown schedule rule "meta_schedule.pool_max" for target keys ...`` from C++ (``LOG(WARNING)``,
straight to stderr, not through Python's logging), removes the annotation and lets the generic rules
schedule the block. Nothing is wrong and a user can do nothing about it.

:func:`quiet_missing_rules` registers, for each rule a task names that TVM has for none of the target's
keys, a function that does exactly that fallback (remove the annotation, keep the schedule), so the
design space is the same and the message is gone. A rule TVM has is never replaced, nor dynatune's own
(:mod:`dynatune.model.outer_reduction`), which it registers first.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)

_ANNOTATION = re.compile(r'"schedule_rule": "([^"]+)"')


def named_rules(mod) -> set[str]:
    """The custom rules ``mod``'s blocks name (``"None"``, which means no custom rule, left out)."""
    return {r for r in _ANNOTATION.findall(mod.script(show_meta=False)) if r != "None"}


def _generic_rules(sch, block):
    """What ``ApplyCustomRule`` does for a rule it cannot find, less the warning."""
    sch.unannotate(block, "schedule_rule")
    return [sch]


def quiet_missing_rules(mod, target) -> list[str]:
    """Register the generic fallback for every custom rule ``mod`` names that TVM has for none of
    ``target``'s keys (call before the design space is generated). Returns the function names registered
    now (a rule registered before, by TVM or by an earlier call, is not registered again)."""
    import tvm

    from dynatune.model.outer_reduction import register_rule

    register_rule()  # dynatune's own rule: never replaced by the fallback
    keys = [str(k) for k in target.keys]
    added = []
    for rule in sorted(named_rules(mod)) if keys else []:
        names = [f"s_tir.meta_schedule.{key}.{rule}" for key in keys]
        if any(tvm.get_global_func(name, allow_missing=True) is not None for name in names):
            continue
        tvm.register_global_func(names[0], _generic_rules)
        added.append(names[0])
        log.debug("TVM has no schedule rule %s for %s: its blocks get the generic rules", rule, keys)
    return added
