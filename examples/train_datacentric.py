"""A tiny model trained by a plain PyTorch loop (train_plain.py) and by the same loop
under Data-Centric Parallel (train_datacentric.py, also under `torchrun
--nproc-per-node 2`). Diff the two files: at most ten lines change.

The model is our Llama by default, or an unmodified Hugging Face / diffusers model:
`python examples/train_plain.py hf:mistral` (hf:qwen2, hf:gpt2, diffusers:wan).
"""

import sys

import torch

from datacentric import DataCentric
from datacentric.verify.case_models import build_case

name = sys.argv[1] if len(sys.argv) > 1 else "llama"
model, dataset = build_case(name, seed=0, dtype=torch.float32)
dc = DataCentric(model, dataset, policy="dcp-opt", tokens_per_iteration=1024)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
for step, batch_step in enumerate(dc.steps(iterations=6)):
    for micro in batch_step:
        micro.backward(model(micro.batch))
    loss = batch_step.finish()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    print(f"step {step} loss {float(loss):.4f}")
