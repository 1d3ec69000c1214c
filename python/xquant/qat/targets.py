"""compressed-tensors' `targets` / `ignore` matching, in one place (shared by xquant.qat and usable by the
CLI's Python tests and other front ends).

A pattern matches a module when (compressed-tensors `utils.match`, 0.20):

* it is the name of a class in the module's MRO (``"Linear"`` matches ``torch.nn.Linear`` and every
  subclass, e.g. xquant.qat's ``QuantLinear``); vLLM's ``LinearBase`` also matches ``"Linear"``;
* it starts with ``re:`` and the rest is a Python regular expression that matches at the start of the
  module's dotted name (``re.match``, not a search: ``"re:.*proj$"``, ``"re:model\\.layers\\.0\\."``);
* otherwise it equals the module's dotted name exactly (``"lm_head"``, ``"model.layers.0.mlp.up_proj"``).

Unlike compressed-tensors (which only logs a warning), :func:`match_modules` raises ``ValueError`` for a
target or ignore pattern that matches no module of the model: a misspelt pattern never passes silently.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Optional, Sequence

__all__ = ["is_match", "match_name", "match_class", "match_modules", "check_patterns", "DEFAULT_DENSE"]

# The CLI's default dense set (docs/cli.md, "Which modules are quantized"): output heads and MoE routers,
# by last name component, and BERT's MLM decoder by full name. Applied when no targets are given.
DEFAULT_DENSE = ("lm_head", "embed_out", "gate", "router", "shared_expert_gate")


def check_patterns(what: str, patterns: Optional[Iterable[str]]) -> list[str]:
    """The patterns as a list of str; a bad pattern (not a str, empty, an invalid ``re:`` expression) is a
    TypeError / ValueError naming it."""
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for p in patterns:
        if not isinstance(p, str):
            raise TypeError(f"xquant.qat: {what} pattern {p!r} is a {type(p).__name__} but expected a str "
                            "(a class name such as 'Linear', 're:<regex>' or a module name)")
        if not p or p == "re:":
            raise ValueError(f"xquant.qat: {what} pattern {p!r} is empty (expected a class name such as 'Linear', "
                             "'re:<regex>' or a module name)")
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as e:
                raise ValueError(f"xquant.qat: {what} pattern {p!r} is not a valid regular expression: {e}") from None
        out.append(p)
    return out


def match_name(name: str, pattern: str) -> bool:
    """``re:`` patterns: ``re.match`` on the dotted name; other patterns: equality."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name


def match_class(module, pattern: str) -> bool:
    """True when a class in the module's MRO has this name (``LinearBase`` also answers to ``Linear``)."""
    import torch

    return any(issubclass(c, torch.nn.Module) and (c.__name__ == pattern or (c.__name__ == "LinearBase" and pattern == "Linear"))
               for c in type(module).__mro__)


def is_match(name: str, module, patterns: Sequence[str]) -> bool:
    return any(match_name(name, p) or match_class(module, p) for p in patterns)


def match_modules(model, targets: Iterable[str], ignore: Iterable[str] = (), *,
                  require_all: bool = True) -> Iterator[tuple[str, object]]:
    """(name, module) for every module of ``model`` (in ``named_modules`` order, the root excluded) that
    a target matches and no ignore pattern matches. With ``require_all`` a target or ignore pattern that
    matches no module at all (ignored or not) raises ``ValueError`` naming it and the model's class."""
    targets = check_patterns("targets", targets)
    ignore = check_patterns("ignore", ignore)
    unmatched_t, unmatched_i = set(targets), set(ignore)
    found = []
    for name, module in model.named_modules():
        if not name:
            continue
        hit_t = [p for p in targets if match_name(name, p) or match_class(module, p)]
        hit_i = [p for p in ignore if match_name(name, p) or match_class(module, p)]
        unmatched_t.difference_update(hit_t)
        unmatched_i.difference_update(hit_i)
        if hit_t and not hit_i:
            found.append((name, module))
    if require_all and (unmatched_t or unmatched_i):
        which = [f"targets pattern {p!r}" for p in targets if p in unmatched_t] + \
                [f"ignore pattern {p!r}" for p in ignore if p in unmatched_i]
        raise ValueError(f"xquant.qat: {', '.join(which)} matches no module of {type(model).__name__} (patterns are "
                         "class names such as 'Linear', 're:<regex>' matched at the start of the module name, or "
                         "exact module names)")
    return iter(found)
