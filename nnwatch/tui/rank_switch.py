"""``[`` and ``]``: for a rank of a distributed job, watch the previous or next rank's run. The
ranks pane's data comes from ``RankCollector``; switching opens the other rank's live source."""

from __future__ import annotations

from typing import Protocol

from nnwatch.sources.base import SourceError
from nnwatch.sources.live import LiveSource
from nnwatch.tui.collectors import JobViewCollector
from nnwatch.tui.feeds import Feeds
from nnwatch.tui.host import Notifier


class RankHost(Notifier, Protocol):
    """What switching ranks needs of the app: a word to the user, and a main run that changed."""

    title: str

    def main_run_changed(self) -> None: ...


class RankSwitch:
    """Switching the dashboard between the ranks of one job."""

    def __init__(self, host: RankHost, feeds: Feeds) -> None:
        self.host = host
        self.feeds = feeds

    def step(self, delta: int) -> None:
        """``delta`` ranks on (``]``: 1, ``[``: -1), round the job's ranks."""
        ranks = self.feeds.ranks
        job = ranks.job if ranks is not None else None
        if job is None or len(job.runs) < 2:
            where = (
                "the other ranks are not on this machine"
                if job
                else "open them from the job view (q goes back to it)"
                if isinstance(ranks, JobViewCollector)
                else "still looking for the other ranks"
            )
            self.host.notify(
                f"No other rank to switch to: {where}.", title="rank", severity="warning"
            )
            return
        order = job.ranks
        here = self.feeds.source.meta.rank
        i = order.index(here) if here in order else -1 if delta > 0 else 0
        self.switch(order[(i + delta) % len(order)])

    def switch(self, rank: int) -> bool:
        """Watch another rank of the job: a new live source, a fresh run state, the old source
        closed (in a thread, once its collector has stopped). False, with a note, if it cannot."""
        job = self.feeds.ranks.job if self.feeds.ranks is not None else None
        info = job.run_for(rank) if job is not None else None
        if job is None or info is None:
            self.host.notify(
                f"Rank {rank} is not on this machine.", title="rank", severity="warning"
            )
            return False
        if rank == self.feeds.source.meta.rank:
            return True
        try:
            source = LiveSource.from_info(info)
        except SourceError as exc:
            self.host.notify(f"Cannot open rank {rank}: {exc}", title="rank", severity="error")
            return False
        self.feeds.replace_primary(source)
        self.host.title = f"nnwatch · {source.meta.name} · rank {rank}"
        self.host.main_run_changed()
        self.host.notify(f"Watching rank {rank}/{job.world_size}.", title="rank", timeout=3)
        return True
