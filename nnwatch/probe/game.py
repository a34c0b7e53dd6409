"""Two watched nets that step in turn are the two sides of a game (a GAN's G and D).

One side's loss rising is the other side learning: judged alone, a generator whose loss climbs
from 1.4 to 2.8 looks like a divergence, and a discriminator near ln 2 looks stalled. When two
watches in one process step alternately for a few rounds, each one's diagnosis is told so once;
its loss-level findings then stand down and the game's own checks take over (one side's loss
going to zero, non-finite values, exploding norms).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

TURNS = 3  # steps, each after the other net stepped, before a pair is called a game
#: ... with at most this many of the watch's own steps between two such turns: a critic that
#: steps five times per generator step (WGAN-GP's n_critic) still takes its turns
GAP = 20


class Player(Protocol):
    """What the game needs of a watch: its name, and whether it is still open."""

    @property
    def name(self) -> str: ...

    @property
    def closed(self) -> bool: ...


P = TypeVar("P", bound=Player)

_tick = 0
_last: weakref.WeakKeyDictionary[Player, int] = weakref.WeakKeyDictionary()
_turns: weakref.WeakKeyDictionary[Player, int] = weakref.WeakKeyDictionary()
_alone: weakref.WeakKeyDictionary[Player, int] = weakref.WeakKeyDictionary()  # steps since a turn


def note_step(w: P, open_watches: Iterable[P], on_game: Callable[[P], None]) -> None:
    """``w`` stepped: count it as a turn when another open watch stepped since ``w`` last did."""
    global _tick
    _tick += 1
    prev = _last.get(w, 0)
    _last[w] = _tick
    partner = None
    if prev:
        for other in open_watches:
            if other is not w and not other.closed and _last.get(other, -1) > prev:
                partner = other
                break
    if partner is None:
        alone = _alone[w] = _alone.get(w, 0) + 1
        if alone > GAP:
            _turns[w] = 0
        return
    _alone[w] = 0
    n = _turns[w] = _turns.get(w, 0) + 1
    if n == TURNS:
        print(
            f"nnwatch: {w.name} and {partner.name} step in turn: "
            f"{w.name} is judged as one side of a game (a GAN), where a rising "
            "loss is the other side learning",
            file=sys.stderr,
        )
        on_game(w)
