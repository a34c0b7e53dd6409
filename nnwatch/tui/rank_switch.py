"""``[`` and ``]``: for a rank of a distributed job, watch the previous or next rank's run. The
ranks pane's data comes from ``RankCollector``; switching opens the other rank's live source."""

from __future__ import annotations

from nnwatch.sources.base import SourceError
from nnwatch.sources.live import LiveSource
from nnwatch.tui.collectors import JobViewCollector
from nnwatch.tui.monitor import MonitorBase


class RankActions(MonitorBase):
    """Switching the dashboard between the ranks of one job."""

    def action_prev_rank(self) -> None:
        self._step_rank(-1)

    def action_next_rank(self) -> None:
        self._step_rank(1)

    def _step_rank(self, delta: int) -> None:
        job = self.ranks.job if self.ranks is not None else None
        if job is None or len(job.runs) < 2:
            where = (
                "the other ranks are not on this machine"
                if job
                else "open them from the job view (q goes back to it)"
                if isinstance(self.ranks, JobViewCollector)
                else "still looking for the other ranks"
            )
            self.notify(f"No other rank to switch to: {where}.", title="rank", severity="warning")
            return
        ranks = job.ranks
        here = self.source.meta.rank
        i = ranks.index(here) if here in ranks else -1 if delta > 0 else 0
        self.switch_rank(ranks[(i + delta) % len(ranks)])

    def switch_rank(self, rank: int) -> bool:
        """Watch another rank of the job: a new live source, a fresh run state, the old source
        closed (in a thread, once its collector has stopped). False, with a note, if it cannot."""
        job = self.ranks.job if self.ranks is not None else None
        info = job.run_for(rank) if job is not None else None
        if job is None or info is None:
            self.notify(f"Rank {rank} is not on this machine.", title="rank", severity="warning")
            return False
        if rank == self.source.meta.rank:
            return True
        try:
            source = LiveSource.from_info(info)
        except SourceError as exc:
            self.notify(f"Cannot open rank {rank}: {exc}", title="rank", severity="error")
            return False
        self.feeds.replace_primary(source)
        self.title = f"nnwatch · {source.meta.name} · rank {rank}"
        self._main_run_changed()
        self.notify(f"Watching rank {rank}/{job.world_size}.", title="rank", timeout=3)
        return True
