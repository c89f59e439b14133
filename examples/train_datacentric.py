"""The tiny Llama on the standard-library corpus, trained by a plain PyTorch loop
(train_plain.py) and by the same loop under Data-Centric Parallel
(train_datacentric.py, also under `torchrun --nproc-per-node 2`). Diff the two files.
"""

import torch

from datacentric import DataCentric
from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model

torch.manual_seed(0)
dataset = StdlibCorpus(max_tokens=512, limit=3)
model = build_model("llama")
dc = DataCentric(model, dataset, preset="llama", policy="dcp-opt", tokens_per_iteration=2048)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
for step, batch_step in enumerate(dc.steps()):
    for micro in batch_step:
        micro.backward(model(micro.batch))
    loss = batch_step.finish()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    print(f"step {step} loss {float(loss):.4f}")
