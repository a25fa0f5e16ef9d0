"""What a dynamic vocabulary admits, keeps and evicts: one definition behind every API.

:class:`VocabularyPolicy` is the one object that ``hash_embedding_variable``'s
keyword arguments, DeepRec's ``EmbeddingVariableOption(filter_option=...,
evict_option=...)`` and SOK's ``DynamicVariable(evict_strategy=...)`` all
map onto; :mod:`.dynamic` carries it out. Every decision is a function of a
key's own history (how many training lookups saw it, the global step of the
last one, its vector) or of totals over all workers, so N workers decide
key by key what one process decides.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

EVICT_STRATEGIES = ("lru", "lfu")
POLICY_KEYWORDS = ("min_count", "counter_capacity", "counter_steps_to_live", "default_value", "steps_to_live",
                   "l2_weight_threshold", "evict_every_steps", "evict_at_checkpoint", "evict_strategy", "max_fill",
                   "fill_after_evict")
"""The keyword arguments of :func:`hash_embedding_variable` that make its :class:`VocabularyPolicy`."""


@dataclasses.dataclass(frozen=True)
class VocabularyPolicy:
    """Admission, eviction and the full-table rule of one hash-table vocabulary.

    Counting: a key is *seen* once per training lookup that holds it anywhere
    in the global batch (repeats within one lookup count once), by the
    worker that owns it. Steps are the global step.

    Args:
      min_count: a key gets a row once it has been seen this many times
        (DeepRec's ``CounterFilter(filter_freq)``). Until then it reads
        ``default_value``, gets no gradient and holds no row; its count lives
        in the owner's counter table.
      counter_capacity: keys the counter table holds per worker (default:
        the table's capacity). A key that finds it full is not counted in
        that lookup (logged by the counter's ``dropped`` total).
      counter_steps_to_live: a counted key not seen for more than this many
        steps leaves the counter table (its count restarts); default
        ``steps_to_live``, else counts stay until admission.
      default_value: what keys without a row read: a number or ``dim``
        numbers (DeepRec's ``default_value_no_permission``); also what an
        exported model serves for them.
      steps_to_live: evict keys whose last training lookup is more than this
        many steps before the eviction step (DeepRec's ``GlobalStepEvict``).
      l2_weight_threshold: evict rows whose L2 norm is below this (DeepRec's
        ``L2WeightEvict``).
      evict_every_steps: eviction runs after the update of every step whose
        new global step is a multiple of this; None: no runs at an interval.
      evict_at_checkpoint: eviction also runs when
        ``collective.checkpoint.Saver`` saves (full or delta; every worker at
        the same step, before any row is written), as DeepRec does.
      evict_strategy: ``"lru"`` or ``"lfu"``: when the table's keys (summed
        over workers) exceed ``max_fill`` of its capacity (summed over
        workers), an eviction run drops the least recently / least often
        seen keys down to ``fill_after_evict`` by one threshold on age /
        count agreed over all workers. Without it a full table fails.
      max_fill, fill_after_evict: the fractions above.
    """

    min_count: int = 1
    counter_capacity: Optional[int] = None
    counter_steps_to_live: Optional[int] = None
    default_value: Union[float, Tuple[float, ...]] = 0.0
    steps_to_live: Optional[int] = None
    l2_weight_threshold: Optional[float] = None
    evict_every_steps: Optional[int] = 100
    evict_at_checkpoint: bool = False
    evict_strategy: Optional[str] = None
    max_fill: float = 0.9
    fill_after_evict: float = 0.75

    def __post_init__(self):
        if isinstance(self.default_value, (list, tuple)):
            object.__setattr__(self, "default_value", tuple(float(v) for v in self.default_value))
        else:
            object.__setattr__(self, "default_value", float(self.default_value))
        if self.evict_strategy is not None:
            object.__setattr__(self, "evict_strategy", str(self.evict_strategy).lower())

    @property
    def admits_on_first_sight(self) -> bool:
        return self.min_count <= 1

    @property
    def evicts(self) -> bool:
        return self.steps_to_live is not None or self.l2_weight_threshold is not None or \
            self.evict_strategy is not None

    @property
    def purges_counter(self) -> bool:
        return not self.admits_on_first_sight

    @property
    def counter_ttl(self) -> Optional[int]:
        return self.counter_steps_to_live if self.counter_steps_to_live is not None else self.steps_to_live

    def default_row(self, dim: int) -> Tuple[float, ...]:
        """``default_value`` as ``dim`` numbers."""
        if isinstance(self.default_value, tuple):
            return self.default_value
        return (self.default_value,) * int(dim)

    def check(self, table: str, dim: int) -> "VocabularyPolicy":
        """Raises ``ValueError`` naming ``table`` when an option is out of range; returns the policy."""
        problems = []
        if int(self.min_count) < 1:
            problems.append(f"min_count={self.min_count} must be >= 1")
        for name in ("counter_capacity", "evict_every_steps"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                problems.append(f"{name}={value} must be >= 1")
        for name in ("steps_to_live", "counter_steps_to_live"):
            value = getattr(self, name)
            if value is not None and int(value) < 0:
                problems.append(f"{name}={value} must be >= 0")
        if self.l2_weight_threshold is not None and float(self.l2_weight_threshold) < 0:
            problems.append(f"l2_weight_threshold={self.l2_weight_threshold} must be >= 0")
        if self.evicts and self.evict_every_steps is None and not self.evict_at_checkpoint:
            problems.append("the policy evicts but never runs: give evict_every_steps=... or evict_at_checkpoint=True")
        if self.evict_strategy is not None and self.evict_strategy not in EVICT_STRATEGIES:
            problems.append(f"evict_strategy={self.evict_strategy!r} must be one of {EVICT_STRATEGIES} or None")
        if not 0.0 < self.fill_after_evict < self.max_fill <= 1.0:
            problems.append(f"need 0 < fill_after_evict ({self.fill_after_evict}) < max_fill ({self.max_fill}) <= 1")
        if isinstance(self.default_value, tuple) and len(self.default_value) != int(dim):
            problems.append(f"default_value has {len(self.default_value)} numbers; give one or dim={dim}")
        if problems:
            raise ValueError(f"hash table '{table}': " + "; ".join(problems))
        return self


def policy_from(table: str, policy: Optional[VocabularyPolicy], keywords: dict) -> Optional[VocabularyPolicy]:
    """The policy of ``hash_embedding_variable(..., policy=..., **keywords)``; None when neither is given."""
    unknown = sorted(set(keywords) - set(POLICY_KEYWORDS))
    if unknown:
        raise TypeError(f"hash table '{table}': unknown keyword arguments {unknown}; the policy's are "
                        f"{', '.join(POLICY_KEYWORDS)}")
    if policy is not None and keywords:
        raise TypeError(f"hash table '{table}': give either policy=VocabularyPolicy(...) or its keyword arguments "
                        f"({', '.join(sorted(keywords))}), not both")
    if policy is None and keywords:
        policy = VocabularyPolicy(**keywords)
    return policy
