"""The tiny Llama on the standard-library corpus, trained by a plain PyTorch loop
(train_plain.py) and by the same loop under Data-Centric Parallel
(train_datacentric.py, also under `torchrun --nproc-per-node 2`). Diff the two files.
"""

import torch

from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model

torch.manual_seed(0)
dataset = StdlibCorpus(max_tokens=512, limit=3)
model = build_model("llama")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
batches = [list(range(i, min(i + 4, len(dataset)))) for i in range(0, len(dataset), 4)]
for step, sample_ids in enumerate(batches):
    batch = dataset.pack(sample_ids)
    loss_per_token = model(batch)
    loss = loss_per_token.sum() / batch.loss_mask.sum()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    print(f"step {step} loss {float(loss):.4f}")
