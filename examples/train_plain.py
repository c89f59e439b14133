"""A tiny model trained by a plain PyTorch loop (train_plain.py) and by the same loop
under Data-Centric Parallel (train_datacentric.py, also under `torchrun
--nproc-per-node 2`). Diff the two files: at most ten lines change.

The model is our Llama by default, or an unmodified Hugging Face / diffusers model:
`python examples/train_plain.py hf:mistral` (hf:qwen2, hf:gpt2, diffusers:wan).
"""

import sys

import torch

from datacentric.verify.case_models import build_case

name = sys.argv[1] if len(sys.argv) > 1 else "llama"
model, dataset = build_case(name, seed=0, dtype=torch.float32)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
batches = [list(range(i, min(i + 4, 24))) for i in range(0, 24, 4)]
for step, sample_ids in enumerate(batches):
    batch = dataset.pack(sample_ids)
    loss_per_token = model(batch)
    loss = loss_per_token.sum() / batch.loss_mask.sum()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
