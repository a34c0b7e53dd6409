"""The layers pane on a language model: the LSTM and a hand-written module get rows, and the
output head that shares the embedding's weight says so instead of showing an empty gradient."""

from __future__ import annotations

import asyncio

import torch
from torch import nn

import nnwatch
from nnwatch.sources.recorded import RecordedSource
from nnwatch.testing.tui import fixed_hardware, settle
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.layers import LayersPane, LayerTable
from tests.plain_models import ScaleShift


class TiedLM(nn.Module):
    """nanoGPT's way: ``lm_head`` without a bias, its weight the embedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(40, 16)
        self.rnn = nn.GRU(16, 16)
        self.ln_f = ScaleShift(16)
        self.lm_head = nn.Linear(16, 40, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(self.rnn(self.wte(x))[0]))


def test_tied_head_and_rnn_rows() -> None:
    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with nnwatch.watch(model, opt, name="tied", budget=None) as w:
        for _ in range(12):
            x = torch.randint(0, 40, (9, 4))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[:-1]).reshape(-1, 40), x[1:].reshape(-1))
            loss.backward()
            opt.step()
            w.step(loss, batch=(x,))
    run = nnwatch.load_run(w.run_dir)
    assert run.meta.extra["tied"] == {"lm_head": "wte"}
    assert "lm_head" not in run.meta.schema.param_layer_names

    async def main() -> None:
        app = NNWatchApp(RecordedSource(w.run_dir), hardware=fixed_hardware, fps=10)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot, app, len(run))
            pane = app.query_one(LayersPane)
            assert {"wte", "rnn", "ln_f", "lm_head"} <= set(pane.shown_rows)
            table = pane.query_one(LayerTable)
            cells = {r.name: [c.plain for c in table.cells(r)] for r in table.rows}
            assert cells["lm_head"][6] == "=wte"  # its gradient lives in the embedding's row
            assert cells["rnn"][2] == "GRU" and cells["ln_f"][2] == "ScaleShift"
            assert cells["rnn"][6] not in ("", "–")  # the GRU's own gradient norm

    asyncio.run(main())
