"""A small set of admitted jobs that together hold every pair of option values the framework admits.

First each value gets a seed: an admitted job that holds it, found by changing only the options the
framework's refusals name (breadth first, on a budget). Then, pair by pair in a fixed order, a pair not yet
covered starts a job from either value's seed with the other value put in; the job then takes, axis by axis,
the value that covers the most pairs still uncovered without being refused (greedy, in the manner of AETG).
A pair that neither seed admits is refused, with the framework's own line for it.
"""
from __future__ import annotations

import heapq
from collections import Counter
import itertools
import re
from dataclasses import dataclass, field

from tests.matrix.axes import Axis
from tests.matrix.oracle import Oracle

Value = tuple[str, object]      # (axis key, value)
Pair = tuple[Value, Value]


@dataclass
class Plan:
    axes: list[Axis]
    jobs: list[dict] = field(default_factory=list)
    refused: dict[Pair, tuple[str, dict]] = field(default_factory=dict)   # pair -> (the framework's line, the job)
    never: dict[Value, str] = field(default_factory=dict)      # values no job admits -> a refusal of one
    pairs: int = 0                                             # pairs of values of different axes
    reused: int = 0                                            # jobs and refusals taken from a stored plan

    def covered(self) -> set[Pair]:
        return {p for job in self.jobs for p in pairs_of(job)}

    def to_json(self) -> dict:
        return {"jobs": [_plain(j) for j in self.jobs],
                "refused": [{"pair": [list(v) for v in pair], "reason": reason, "job": _plain(job)}
                            for pair, (reason, job) in self.refused.items()],
                "never": [{"value": list(value), "reason": reason} for value, reason in self.never.items()]}

    @classmethod
    def from_json(cls, axes: list[Axis], data: dict) -> "Plan":
        plan = cls(axes, jobs=[_frozen_job(j) for j in data.get("jobs", [])])
        for entry in data.get("refused", []):
            pair = tuple((k, _frozen(v)) for k, v in entry["pair"])
            plan.refused[pair] = (entry["reason"], _frozen_job(entry["job"]))
        return plan


def _frozen(value):
    """A value read back from JSON as the axes hold it: a list (trainer.rampup_batch_size) as a tuple."""
    return tuple(value) if isinstance(value, list) else value


def _frozen_job(job: dict) -> dict:
    return {k: _frozen(v) for k, v in job.items()}


def _plain(job: dict) -> dict:
    return dict(sorted(job.items()))


def pairs_of(job: dict) -> set[Pair]:
    items = sorted(job.items(), key=lambda kv: kv[0])
    return {(a, b) for a, b in itertools.combinations(items, 2)}


def all_pairs(axes: list[Axis]) -> list[Pair]:
    ordered = sorted(axes, key=lambda a: a.key)
    return [((a.key, x), (b.key, y)) for a, b in itertools.combinations(ordered, 2)
            for x in a.values for y in b.values]


class Cover:
    def __init__(self, oracle: Oracle, candidates: int = 4, sign: int = -1):
        self.oracle, self.axes, self.candidates, self.sign = oracle, oracle.axes, candidates, sign

    def _named(self, reason: str) -> list[Axis]:
        """The axes a refusal names (`key:`, `key=` or `key ` in its text): the only ones worth changing."""
        return [a for a in self.axes if names(reason, a.key)]

    def repair(self, job: dict, fixed: set[str], budget: int) -> tuple[dict | None, list[tuple[str, dict]]]:
        """An admitted job that keeps the `fixed` axes as they are, found by changing only the options the
        framework's refusals name: fewest changes first, a value the refusal mentions (`parallel=3d does`)
        before the others, at most `budget` verdicts. Returns (the job or None, the (refusal, job)s met)."""
        counter = itertools.count()
        queue, seen, met = [(0, 0, next(counter), job)], {_key(job)}, []
        while queue and len(met) < budget:
            changes, _, _, trial = heapq.heappop(queue)
            reason = self.oracle.verdict(trial)
            if reason is None:
                return trial, met
            met.append((reason, trial))
            for axis in self._named(reason):
                if axis.key in fixed:
                    continue
                for value in axis.values:
                    changed = {**trial, axis.key: value}
                    if _key(changed) not in seen:
                        seen.add(_key(changed))
                        hinted = hints(reason, axis.key, value)
                        heapq.heappush(queue, (changes + 1, 0 if hinted else 1, next(counter), changed))
        return None, met

    def plan(self, stored: Plan | None = None, seed_budget: int = 400, pair_budget: int = 40) -> Plan:
        """Every pair covered or refused. A `stored` plan's jobs and refusals are checked (one verdict each)
        and kept where the framework still says the same: only what a new option adds is searched."""
        plan = Plan(self.axes)
        wanted = all_pairs(self.axes)
        plan.pairs = len(wanted)
        known = {(a.key, v) for a in self.axes for v in a.values}
        uncovered = set(wanted)
        for job in (stored.jobs if stored else []):
            if set(job.items()) <= known and pairs_of(job) & uncovered and self.oracle.verdict(job) is None:
                plan.jobs.append(job)
                uncovered -= pairs_of(job)
                plan.reused += 1
        seeds: dict[Value, dict] = {}
        for job in plan.jobs:
            for item in job.items():
                seeds.setdefault(item, job)
        for axis in self.axes:
            for value in axis.values:
                if (axis.key, value) not in seeds:
                    seed, met = self.repair({axis.key: value}, {axis.key}, seed_budget)
                    if seed is None:
                        plan.never[(axis.key, value)] = met[0][0]
                    else:
                        seeds[(axis.key, value)] = seed
        uncovered = {p for p in uncovered if p[0] in seeds and p[1] in seeds}
        for pair, (reason, job) in (stored.refused.items() if stored else []):
            if pair in uncovered and self.oracle.verdict(job) == reason:
                plan.refused[pair] = (reason, job)
                uncovered.discard(pair)
                plan.reused += 1
        starts: dict[Pair, dict] = {}
        order_of = {p: i for i, p in enumerate(wanted)}
        while uncovered:
            candidates = []
            scarce = Counter(v for p in uncovered for v in p)
            for pair in sorted(uncovered, key=lambda p: (self.sign * (scarce[p[0]] + scarce[p[1]]), order_of[p])):
                if len(candidates) == self.candidates:
                    break
                start = starts.get(pair) or self._start(pair, seeds, plan, pair_budget)
                if start is None:
                    uncovered.discard(pair)
                    continue
                starts[pair] = start
                order = sorted(self.axes, key=lambda a: _shuffled(a.key, len(candidates)))
                job = self._extend(start, uncovered, order)
                candidates.append((len(pairs_of(job) & uncovered), -len(candidates), job))
            if candidates:
                _, _, job = max(candidates, key=lambda c: c[:2])
                plan.jobs.append(job)
                uncovered -= pairs_of(job)
        plan.jobs = without_redundant(plan.jobs)
        return plan

    def _start(self, pair: Pair, seeds: dict, plan: Plan, budget: int) -> dict | None:
        """An admitted job holding `pair`, from either value's seed; None (and the pair refused) if none."""
        (a, x), (b, y) = pair
        met = []
        for start in ({**seeds[(a, x)], b: y}, {**seeds[(b, y)], a: x}):
            job, more = self.repair(start, {a, b}, budget)
            met += more
            if job is not None:
                return job
        plan.refused[pair] = _clearest(met, a, b)
        return None

    def _extend(self, job: dict, uncovered: set[Pair], order: list[Axis]) -> dict:
        """Axis by axis in `order`, the value covering most uncovered pairs that the framework admits."""
        for axis in order:
            gains = sorted(((sum(_pair(v, axis.key, value) in uncovered for v in job.items() if v[0] != axis.key),
                             i, value) for i, value in enumerate(axis.values)), key=lambda t: (-t[0], t[1]))
            now = job.get(axis.key, _UNSET)
            for gain, _, value in gains:
                if gain == 0 or value == now:
                    break
                trial = {**job, axis.key: value}
                if self.oracle.verdict(trial) is None:
                    job = trial
                    break
        return job


_UNSET = object()


def _shuffled(key: str, salt: int) -> str:
    """A fixed permutation of the axes per candidate (the same plan every run)."""
    import hashlib
    return hashlib.sha1(f"{salt}:{key}".encode()).hexdigest() if salt else ""


def without_redundant(jobs: list[dict]) -> list[dict]:
    """Drop jobs whose every pair another job also holds, those holding fewest pairs of their own first."""
    count = Counter(p for job in jobs for p in pairs_of(job))
    kept = list(jobs)
    while True:
        spare = [j for j in kept if all(count[p] > 1 for p in pairs_of(j))]
        if not spare:
            return kept
        drop = min(spare, key=lambda j: len(pairs_of(j)))
        kept.remove(drop)
        count.subtract(pairs_of(drop))


def _pair(item: Value, key: str, value) -> Pair:
    return tuple(sorted([item, (key, value)], key=lambda kv: kv[0]))


def hints(reason: str, key: str, value) -> bool:
    """Whether a refusal suggests `value` for `key` (`key=value`, or a named choice such as `use LoopedBFS`)."""
    if f"{key}={_text(value)}" in reason:
        return True
    return isinstance(value, str) and len(value) > 2 and bool(re.search(rf"\b{re.escape(value)}\b", reason))


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def names(reason: str, key: str) -> bool:
    """Whether a refusal names the option `key` (as `key:`, `key=` or `key ...`)."""
    return bool(re.search(rf"(^|[^\w.]){re.escape(key)}([^\w.]|$)", reason))


def _clearest(met: list[tuple[str, dict]], a: str, b: str) -> tuple[str, dict]:
    """Of the refusals a pair met, the one that names most of its two keys (then the first)."""
    return max(met, key=lambda m: (names(m[0], a) + names(m[0], b), -met.index(m)))


def _key(job: dict) -> tuple:
    return tuple(sorted(job.items(), key=lambda kv: kv[0]))
