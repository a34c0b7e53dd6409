"""What nnwatch costs a training loop, side by side with what users would otherwise write.

Variants run interleaved in one process, each paired with a bare block right next to it (bare,
nnwatch, bare, detailed, ...; the pair's order flips every round), so that the machine's drift
hits both halves of a pair alike. Each nnwatch variant watches its own copy of the model for the
whole benchmark, warmed up once, so nothing runs between a block and its bare partner (the
probe's cost budget takes the median step time, so the pauses between its blocks do not move it). Each block times ``--steps`` steps; a variant's time ratio in a
round is its block's total time over its paired bare block's, and the report gives the median and
min-max of those ratios over the rounds. Totals, not median steps, because the median step leaves
out whatever runs every few steps (TensorBoard's histograms every 10, nnwatch's measured steps);
the median-step ratio is shown beside it. The ``bare`` row compares consecutive bare blocks of
a round: the noise floor of every other row. Because end-to-end ratios on a shared 2-core
machine swing by several percent between identical loops, nnwatch's *direct* cost is also timed
in place: the time spent inside its hooks and ``step()``, as a share of the bare step (the
median of the bare blocks' mean steps). The naive hooks and the TensorBoard calls are timed in
place the same way, so the direct costs compare at a resolution the end-to-end ratios lack.
``background`` is the CPU time of nnwatch's log-writer thread (the run log, the overview and, until
they move to their own process, the detectors, fed each record) per record, as a share of the bare
step: it runs off the training thread, but shares the cores and the GIL, and its drains land in
whichever block is running. ``detectors proc`` is the CPU time of the detectors' own process per
record it judged, as a share of the bare step: off this process's GIL, on another core (empty
where the detectors stayed in the thread: their cost was below half the budget). ``floor`` is
the least a live monitor can do per step, written out by hand (``floor_monitor.py``: the hooks,
the global gradient norm at the end of every backward, one record into an mmap ring): the physical
limit of a Python probe that takes the norm on every step, measured in the same run, so that
nnwatch's distance to it is its own bookkeeping.

    python bench/overhead.py                 # all models, 12 rounds
    python bench/overhead.py --models mlp --rounds 4 --steps 5   # quick look
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from floor_monitor import FloorMonitor
from torch import nn

import nnwatch
from nnwatch.diagnosis.live import HAND_OVER_AFTER
from nnwatch.probe.budget import UPDATE_EVERY
from nnwatch.probe.layer_hooks import LayerHooks
from nnwatch.probe.schedule import WARMUP_STEPS
from nnwatch.probe.step_cycle import StepCycle
from nnwatch.probe.watch import internals


# ------------------------------------------------------------------------------------------------
# models
def mlp() -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    m = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10),
    )
    return m, lambda: (torch.randn(128, 784), torch.randint(0, 10, (128,)))


def cnn() -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    m = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )
    return m, lambda: (torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 256)
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(dim=1))


def transformer() -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    return Encoder(), lambda: (torch.randn(16, 128, 32), torch.randint(0, 10, (16,)))


def tiny() -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]], nn.Module]:
    """A hand-sized regression: a step of about 0.2 ms, where a fixed cost per step shows most."""
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    return m, lambda: (torch.randn(32, 16), torch.randn(32, 1)), nn.MSELoss()


def mlp_1ms() -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    """A small MLP, a step of about 1 ms on one CPU thread."""
    m = nn.Sequential(
        nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10),
    )
    return m, lambda: (torch.randn(64, 128), torch.randint(0, 10, (64,)))


class Unrolled(nn.Module):
    """An LSTMCell unrolled in Python (pytorch/examples' time_sequence_prediction): one module
    call per time step, so about a thousand hooked calls per forward."""

    def __init__(self, steps: int = 500) -> None:
        super().__init__()
        self.steps = steps
        self.cell = nn.LSTMCell(4, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(x.shape[0], 32, device=x.device)
        for t in range(self.steps):
            h, c = self.cell(x[:, t % x.shape[1]], (h, c))
        return self.head(h)


def many_calls() -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    return Unrolled(), lambda: (torch.randn(8, 50, 4), torch.randint(0, 10, (8,)))


MODELS = {
    "mlp": mlp, "cnn": cnn, "transformer": transformer,
    "tiny": tiny, "mlp_1ms": mlp_1ms, "many_calls": many_calls,
}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# timing a monitor's own code in place
class DirectTimer:
    """Accumulates the time spent inside a monitor's own code (hooks, step calls), wrapped in place."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.total += time.perf_counter() - t

        return timed


# ------------------------------------------------------------------------------------------------
# what users would otherwise write
def naive_hooks(model: nn.Module, timer: DirectTimer) -> Callable[[], None]:
    """The blog-post monitor: .item() per layer per step."""
    stats: dict[str, tuple[float, float, float]] = {}

    def make(name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, inp: Any, out: Any) -> None:
            o = out[0] if isinstance(out, tuple) else out
            d = o.detach()
            stats[name] = (d.mean().item(), d.std().item(), (d == 0).float().mean().item())

        return hook

    handles = [
        m.register_forward_hook(timer.wrap(make(n)))
        for n, m in model.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ReLU, nn.LayerNorm, nn.BatchNorm2d))
    ]
    return lambda: [h.remove() for h in handles]  # type: ignore[func-returns-value]


@dataclass
class Variant:
    name: str
    times: list[list[float]] = field(default_factory=list)  # per round, per step seconds
    paired: list[list[float]] = field(default_factory=list)  # per round, the paired bare block
    direct: list[float] = field(default_factory=list)  # per round, seconds per step in its own code
    #: per round, seconds per step spent recording what each measured update did to the weights
    #: (the samples before, the norms after): part of ``direct``
    updates: list[float] = field(default_factory=list)
    intervals: list[int] = field(default_factory=list)  # the probe's measurement interval
    layer_intervals: list[int] = field(default_factory=list)  # ... and full-statistics interval
    #: CPU seconds nnwatch's log-writer thread spent (log, overview, detectors) and the records
    #: it took in: off the training thread, but on this machine's cores and under its GIL
    background: list[float] = field(default_factory=lambda: [0.0, 0.0])
    #: CPU seconds of the detectors' own process, when they moved there (off this process's GIL,
    #: on another core), and the records judged there
    judge: list[float] = field(default_factory=lambda: [0.0, 0.0])
    update_timer: DirectTimer | None = None


def run_model(name: str, rounds: int, steps: int, warmup: int, device: str = "cpu") -> dict[str, Variant]:
    torch.manual_seed(0)
    build = MODELS[name]
    built = build()
    model, batch = built[0], built[1]
    model.to(device)
    loss_fn = built[2] if len(built) > 2 else nn.CrossEntropyLoss()  # type: ignore[misc]
    data = [tuple(t.to(device) for t in batch()) for _ in range(4)]
    on_gpu = device.startswith("cuda")
    tmp = tempfile.mkdtemp(prefix="nnw-bench-")

    def train_steps(n: int, on_step: Callable[[torch.Tensor, Any, int], None] | None,
                    clip: Callable[[], Any] | None = None, *, net: nn.Module,
                    opt: torch.optim.Optimizer) -> list[float]:
        out = []
        for i in range(n):
            x, y = data[i % len(data)]
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            if clip is not None:
                clip()
            opt.step()
            if on_step is not None:
                on_step(loss, (x, y), i)
            if on_gpu and i == n - 1:
                torch.cuda.synchronize()  # the block's total is the GPU's, not the launches'
            out.append(time.perf_counter() - t)
        return out

    def timed_block(v: Variant, timer: DirectTimer, on_step: Callable[[torch.Tensor, Any, int], None] | None,
                    clip: Callable[[], Any] | None = None, *, net: nn.Module,
                    opt: torch.optim.Optimizer) -> None:
        """Warm up, then time one block of ``v`` and what its own code took per step."""
        train_steps(warmup, on_step, clip, net=net, opt=opt)
        timer.total = 0.0
        upd = v.update_timer
        if upd is not None:
            upd.total = 0.0
        v.times.append(train_steps(steps, on_step, clip, net=net, opt=opt))
        v.direct.append(timer.total / steps)
        if upd is not None:
            v.updates.append(upd.total / steps)

    bare_opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    watches: list[Any] = []
    variants = {n: Variant(n) for n in ("bare", "floor", "nnwatch", "nnwatch_detailed",
                                         "nnwatch_noguard", "naive_item_hooks", "tensorboard")}

    def start_watch(v: Variant, **opts: Any) -> Callable[[], None]:
        """A watch on its own copy of the model, alive for the whole benchmark.

        One watch per variant, warmed up once: its cost budget settles before the first timed
        block, and each timed block then runs right next to its bare block, with no warm-up in
        between. The copy does the same arithmetic as the bare model. Everything nnwatch runs on
        the training thread is timed in place: the forward pre-hook, the per-layer hooks (while
        attached) and the optimizer pre-hook, captured when the watch attaches them, and step().
        """
        net = copy.deepcopy(model)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        timer = DirectTimer()
        cls, hooks_cls = StepCycle, LayerHooks
        saved = {n: getattr(cls, n) for n in ("on_forward_start", "before_optimizer_step",
                                                "on_backward")}
        make_layer_hook = hooks_cls.make
        for n in saved:
            setattr(cls, n, timer.wrap(saved[n]))
        hooks_cls.make = lambda self, i: timer.wrap(make_layer_hook(self, i))  # type: ignore[method-assign]
        try:
            w = nnwatch.watch(net, opt, name=f"bench-{name}-{v.name}", run_dir=tempfile.mkdtemp(dir=tmp),
                              channel=True, **opts)
        finally:
            for n, f in saved.items():
                setattr(cls, n, f)
            hooks_cls.make = make_layer_hook  # type: ignore[method-assign]
        # queued at the end of each backward through the instance: time it there too
        internals(w).parts.cycle.on_backward_end = timer.wrap(internals(w).parts.cycle.on_backward_end)  # type: ignore[method-assign]
        updates, upd_timer = internals(w).parts.cycle.updates, DirectTimer()
        updates.before = upd_timer.wrap(updates.before)  # type: ignore[method-assign]
        updates.after = upd_timer.wrap(updates.after)  # type: ignore[method-assign]
        v.update_timer = upd_timer
        step = timer.wrap(lambda loss, b, i: w.step(loss, batch=b))
        # past the probe's own warm-up (every step measured) so that its cost budget has settled
        train_steps(WARMUP_STEPS + 4 * UPDATE_EVERY, step, net=net, opt=opt)
        # ... and past the detectors' placement (they judge their cost over 256 records and 2 s,
        # then stay in the writer thread or move to their own process): the steady state
        # (a slow step needs the records as much as the seconds: 256 of 70 ms steps take 18 s)
        diagnosis = internals(w).files.diagnosis
        placed = time.monotonic() + HAND_OVER_AFTER[1] + 1.0
        enough = HAND_OVER_AFTER[0] + 2 * UPDATE_EVERY
        give_up = time.monotonic() + 90.0
        while diagnosis is not None and diagnosis.link is None and time.monotonic() < give_up and (
            time.monotonic() < placed or diagnosis.rows_seen < enough
        ):
            train_steps(16, step, net=net, opt=opt)
        run_log = internals(w).files.log
        if run_log is not None:  # (the run files exist from the first step) the writer thread's CPU time per record it wrote and diagnosed
            drain, write = run_log._drain, run_log._write

            def timed_drain() -> None:
                t = time.thread_time()
                try:
                    drain()
                finally:
                    v.background[0] += time.thread_time() - t

            def counted_write(rows: Any) -> None:
                v.background[1] += len(rows)
                write(rows)

            run_log._drain, run_log._write = timed_drain, counted_write  # type: ignore[method-assign]

        def judge_cpu() -> tuple[float, float]:
            diag = internals(w).files.diagnosis
            link = getattr(diag, "link", None)
            if link is None or not link.alive:
                return 0.0, 0.0
            try:
                cpu = psutil.Process(link.pid).cpu_times()
            except psutil.Error:
                return 0.0, 0.0
            return cpu.user + cpu.system, v.background[1]

        def block() -> None:
            before = judge_cpu()
            timed_block(v, timer, step, net=net, opt=opt)
            after = judge_cpu()
            if before[0] and after[0]:
                v.judge[0] += after[0] - before[0]
                v.judge[1] += after[1] - before[1]
            v.intervals.append(internals(w).parts.schedule.budget.interval)
            v.layer_intervals.append(internals(w).parts.schedule.budget.layer_interval)

        watches.append(w)
        return block

    bare = variants["bare"]

    def bare_block() -> list[float]:
        train_steps(warmup, None, net=model, opt=bare_opt)
        times = train_steps(steps, None, net=model, opt=bare_opt)
        bare.times.append(times)
        return times

    def paired(v: Variant, run: Callable[[], None], r: int) -> None:
        """One bare block next to one block of ``v``; which goes first flips every round."""
        if r % 2 == 0:
            v.paired.append(bare_block())
            run()
        else:
            run()
            v.paired.append(bare_block())

    def run_floor() -> None:  # the least a monitor can do: hooks, the norm, one record a step
        timer = DirectTimer()
        floor = FloorMonitor(model, bare_opt, timer.wrap)
        timed_block(variants["floor"], timer, lambda loss, b, i: floor.step(loss), net=model,
                    opt=bare_opt)
        floor.close()

    def run_naive() -> None:  # per-layer hooks + a .item() global norm, as in the textbook loop
        timer = DirectTimer()
        remove = naive_hooks(model, timer)
        clip = timer.wrap(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item())
        timed_block(variants["naive_item_hooks"], timer, None, clip, net=model, opt=bare_opt)
        remove()

    def run_tensorboard() -> None:  # scalars every step, histograms of every gradient every 10
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(tempfile.mkdtemp(dir=tmp))
        gn: dict[str, torch.Tensor] = {}
        timer = DirectTimer()

        def tb_clip(gn: dict[str, torch.Tensor] = gn) -> None:
            gn["v"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)

        def tb_step(loss: torch.Tensor, b: Any, i: int, writer: Any = writer,
                    gn: dict[str, torch.Tensor] = gn) -> None:
            writer.add_scalar("loss", loss.item(), i)
            writer.add_scalar("grad_norm", gn["v"].item(), i)
            if i % 10 == 0:
                for pn, p in model.named_parameters():
                    if p.grad is not None:
                        writer.add_histogram(f"grad/{pn}", p.grad, i)

        timed_block(variants["tensorboard"], timer, timer.wrap(tb_step), timer.wrap(tb_clip),
                    net=model, opt=bare_opt)
        writer.close()

    nnwatch_blocks = [
        (variants["nnwatch"], start_watch(variants["nnwatch"])),
        (variants["nnwatch_detailed"], start_watch(variants["nnwatch_detailed"], layer_interval=1)),
        (variants["nnwatch_noguard"], start_watch(variants["nnwatch_noguard"], guard=False)),
    ]
    try:
        for r in range(rounds):
            bare_block()  # the noise floor: consecutive bare blocks
            paired(variants["floor"], run_floor, r)
            for v, block in nnwatch_blocks:
                paired(v, block, r)
            paired(variants["naive_item_hooks"], run_naive, r)
            paired(variants["tensorboard"], run_tensorboard, r)
            print(f"  {name}: round {r + 1}/{rounds} done", flush=True)
    finally:
        for w in watches:
            w.close()
    return variants


def _ratios(blocks: list[list[float]], against: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per pair of blocks: (total time ratio, median step ratio)."""
    total = [sum(a) / sum(b) for a, b in zip(blocks, against, strict=True)]
    step = [statistics.median(a) / statistics.median(b) for a, b in zip(blocks, against, strict=True)]
    return total, step


def report(name: str, variants: dict[str, Variant]) -> list[str]:
    bare = variants["bare"]
    per_round = len(bare.times) // max(len(variants["nnwatch"].paired), 1)
    rounds = len(bare.times) // per_round
    bare_mean = statistics.median(statistics.fmean(t) for t in bare.times)
    lines = [f"\n{name}: bare step {bare_mean * 1e3:.1f} ms (median of block means; "
             f"{rounds} rounds x {len(bare.times[0])} steps per block)"]
    lines.append(
        f"  {'variant':<20} {'time ratio':>10} {'min':>7} {'max':>7} {'step ratio':>11} "
        f"{'direct cost':>12} {'updates':>9} {'background':>11} {'k/stats':>9} {'detectors proc':>15}"
    )
    for v in variants.values():
        if v is bare:  # each bare block against the one before it in the same round
            later = [i for i in range(1, len(bare.times)) if i % per_round]
            total, step = _ratios([bare.times[i] for i in later], [bare.times[i - 1] for i in later])
        else:
            total, step = _ratios(v.times, v.paired)
        direct = f"{statistics.median(v.direct) / bare_mean * 100:10.2f} %" if v.direct else ""
        upd = f"{statistics.median(v.updates) / bare_mean * 100:7.2f} %" if v.updates else ""
        cpu, records = v.background
        background = f"{cpu / records / bare_mean * 100:9.2f} %" if records else ""
        cpu, records = v.judge
        judge = f"{cpu / records / bare_mean * 100:13.2f} %" if records else ""
        every = (
            f"{statistics.median(v.intervals):>4.0f}/{statistics.median(v.layer_intervals):<4.0f}"
            if v.intervals else ""
        )
        lines.append(
            f"  {v.name:<20} {statistics.median(total):10.3f} {min(total):7.3f} {max(total):7.3f} "
            f"{statistics.median(step):11.3f} {direct:>12} {upd:>9} {background:>11} {every:>9} {judge:>15}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (each block ends with a sync)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {where}")
    out: list[str] = []
    for name in args.models:
        out += report(name, run_model(name, args.rounds, args.steps, args.warmup, args.device))
    print("\n".join(out))
    print("\ntime ratio = a variant block's total time / that of the bare block paired with it, "
          "median (min-max) over the rounds: the end-to-end cost, periodic work included (bare: one "
          "bare block against the previous one, the noise floor); step ratio = the same with each "
          "block's median step, which leaves out work done every few steps (TensorBoard's "
          "histograms, nnwatch's measured steps); direct cost = time inside "
          "nnwatch's hooks and step() (naive: its hooks and .item() norm; tensorboard: its "
          "norm and writer calls) / bare step; updates = the part of it that records what each "
          "measured update did to the weights (samples before, norms after), / bare step; "
          "background = nnwatch's writer thread's CPU per record, "
          "detectors proc = the detectors' own process's CPU per record (another core, another "
          "GIL), both / bare step. nnwatch_noguard drops the one non-finite "
          "check before optimizer.step().")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
