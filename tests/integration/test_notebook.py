"""Notebooks and REPLs: a cell re-run again and again must not stack watches, each watch of one
process is its own run, and the watch and the run render in the notebook. The kernel cases run
a real Jupyter kernel (ipykernel) driven through jupyter_client."""

from __future__ import annotations

import json
import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.probe import clip_intercept, hook_hiding

CELL = """
w = nnwatch.watch(model, opt, name="nb")
for _ in range(5):
    x = torch.randn(8, 4)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    w.step(loss)
"""


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_rerunning_a_watch_cell_ten_times_leaves_one_watch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scope: dict[str, Any] = {"nnwatch": nnwatch, "torch": torch, "model": model, "opt": opt}
    watches = []
    for _ in range(10):
        exec(CELL, scope)  # noqa: S102 - a notebook cell, run as the kernel runs it
        watches.append(scope["w"])
        assert _hooks(model) <= 1 + 4  # the root pre-hook, and layer hooks at most while measuring
    live = [w for w in watches if not w.closed]
    assert live == [watches[-1]]
    assert len({w.run_dir for w in watches}) == 10
    for w in watches[:-1]:
        end = json.loads((w.run_dir / "end.json").read_text())
        assert end["status"] == "finished" and "took over" in end["reason"]
    watches[-1].close()
    assert _hooks(model) == 0
    assert not clip_intercept.installed() and not hook_hiding.wrapped_classes()


def test_watch_and_run_render_for_notebooks() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scope: dict[str, Any] = {"nnwatch": nnwatch, "torch": torch, "model": model, "opt": opt}
    exec(CELL, scope)  # noqa: S102
    w = scope["w"]
    text, page = repr(w), w._repr_html_()
    assert "'nb': running, 5 steps" in text and "nnwatch attach nb" in text
    assert "<code>nnwatch attach nb</code>" in page and "running" in page
    w.close()
    run = nnwatch.load_run(w.run_dir)
    assert "'nb': finished, 5 steps" in repr(run)
    assert f"nnwatch open {w.run_dir}" in run._repr_html_()
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    fig = run.plot()
    assert [a.get_ylabel() for a in fig.axes] == ["loss", "grad_norm"]
    assert len(fig.axes[0].lines[0].get_xdata()) == 5


# ------------------------------------------------------------------------------------------------
# a real kernel
SETUP = """
import torch, nnwatch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""
LONG_CELL = """
w = nnwatch.watch(model, opt, name="nb")
print("training", flush=True)
while True:
    x = torch.randn(8, 4)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    w.step(loss)
"""


class Kernel:
    """One ipykernel process, driven like a notebook front end drives it."""

    def __init__(self, env: dict[str, str]) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, extra_arguments=["--HistoryManager.enabled=False"])
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> dict[str, Any]:
        msg_id = self.kc.execute(code)
        return self._reply(msg_id, timeout)

    def run_after_error(self, code: str, timeout: float = 60) -> dict[str, Any]:
        """Run a cell right after one failed: ipykernel aborts requests that reach it while it
        is still clearing its queue after an error (a window that widens on a loaded machine),
        and a user then runs the cell again; so does this, a few times."""
        for _ in range(5):
            reply = self.run(code, timeout)
            if reply.get("status") != "aborted":
                return reply
            time.sleep(0.5)
        return reply

    def _reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    def wait_output(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream" and text in msg["content"].get("text", ""):
                return
        raise AssertionError(f"the kernel never printed {text!r}")

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)


def _kernel_env(run_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env.update(NNWATCH_RUN_DIR=str(run_root), PYTHONPATH=repo + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _runs(run_root: Path) -> list[Path]:
    return sorted(p for p in (run_root / "runs").glob("nb-*") if p.is_dir())


def _end(run: Path) -> dict[str, Any]:
    return json.loads((run / "end.json").read_text())


@pytest.mark.slow
def test_kernel_interrupt_then_rerun_then_restart(run_root: Path) -> None:
    pytest.importorskip("ipykernel")
    kernel = Kernel(_kernel_env(run_root))
    try:
        assert kernel.run(SETUP)["status"] == "ok"
        # a cell that trains until the user presses the notebook's stop button
        msg_id = kernel.kc.execute(LONG_CELL)
        kernel.wait_output("training")
        time.sleep(1.0)
        kernel.km.interrupt_kernel()
        assert kernel._reply(msg_id, 60)["status"] == "error"  # KeyboardInterrupt
        # the next cell's watch takes over: the interrupted run ends as interrupted
        again = kernel.run_after_error(CELL)
        assert again["status"] == "ok", again
        first, second = _runs(run_root)
        assert _end(first)["status"] == "interrupted"
        hooks = kernel.run("assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 1")
        assert hooks["status"] == "ok", hooks
        # the second run can be steered: it has a command socket of its own
        steer = kernel.run(
            "from nnwatch.store.registry import list_runs\n"
            "mine = [r for r in list_runs() if str(r.run_dir) == str(w.run_dir)]\n"
            "assert mine and mine[0].socket, mine"
        )
        assert steer["status"] == "ok", steer
        # the kernel is restarted (killed and started again): the open run is left as a crash
        kernel.km.restart_kernel(now=True)
        run = nnwatch.load_run(second)
        assert run.status == "crashed" and not (second / "end.json").exists()
        assert len(run) == 5  # every step it took is there
    finally:
        kernel.close()


def test_two_watches_open_in_one_process_each_have_a_socket() -> None:
    """Two models watched at once (an encoder pre-train beside a probe, a sweep in one process):
    both are listed as runs of this process and both can be steered."""
    from nnwatch.channel.client import ChannelClient
    from nnwatch.store.registry import list_runs

    models = [nn.Linear(4, 1), nn.Linear(4, 1)]
    watches = [nnwatch.watch(m, None, name=f"pair-{i}") for i, m in enumerate(models)]
    try:
        for m, w in zip(models, watches, strict=True):
            m(torch.randn(2, 4)).sum().backward()
            w.step()
        mine = {r.run_dir: r for r in list_runs() if r.pid == os.getpid()}
        socks = [mine[str(w.run_dir)].socket for w in watches]
        assert all(socks) and len(set(socks)) == 2
        for sock in socks:
            with ChannelClient(sock) as client:
                assert client.hello()["pid"] == os.getpid()
    finally:
        for w in watches:
            w.close()


def test_resume_true_goes_on_in_the_same_run() -> None:
    """A cell re-run with ``resume=True`` appends to the same run directory and step count."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cell = CELL.replace('nnwatch.watch(model, opt, name="nb")', 'nnwatch.watch(model, opt, name="nb", resume=True)')
    scope: dict[str, Any] = {"nnwatch": nnwatch, "torch": torch, "model": model, "opt": opt}
    runs = []
    for _ in range(3):
        exec(cell, scope)  # noqa: S102
        runs.append(scope["w"])
    assert len({w.run_dir for w in runs}) == 1
    assert [w.closed for w in runs] == [True, True, False]
    first_run = runs[-1].run_dir
    # the loop now has two LR groups: the rows have another layout and cannot share the log,
    # so the resumed watch goes on in a sibling directory and the first run stays whole
    opt2 = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=0.01)
    scope["opt"] = opt2
    exec(cell, scope)  # noqa: S102
    scope["w"].close()
    assert scope["w"].run_dir != first_run
    run = nnwatch.load_run(first_run)
    assert run["step"].tolist() == list(range(15))  # 3 cells x 5 steps, one count
    assert run.status == "finished" and _hooks(model) == 0
    assert nnwatch.load_run(scope["w"].run_dir)["step"].tolist() == list(range(15, 20))
