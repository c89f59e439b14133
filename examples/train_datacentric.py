"""A tiny model trained by a plain PyTorch loop (train_plain.py) and by the same loop
under Data-Centric Parallel (train_datacentric.py, also under `torchrun
--nproc-per-node 2`). Diff the two files: at most ten lines change.

Only the public API: `open_dataset` reads any `--dataset` source (here the
standard-library corpus; `jsonl:docs.jsonl` for your own), `build_model_named` builds
any `--model` (our Llama by default, or an unmodified Hugging Face decoder:
`python examples/train_plain.py hf:mistral`, hf:qwen2, hf:gpt2, or a pretrained folder
`hf:path/to/model`, wrapped as `HFCausalLM`; or a diffusers video transformer,
`diffusers:wan`, trained on the synthetic latents `small_dataset` gives it).
"""

import sys

import torch

from datacentric import DataCentric, small_dataset
from datacentric.data import DataConfig, open_dataset
from datacentric.models import build_model_named

name = sys.argv[1] if len(sys.argv) > 1 else "llama"
torch.manual_seed(0)
dataset = open_dataset("stdlib", DataConfig(max_tokens=256, dataset_limit=1))
model = build_model_named(name, dataset=dataset)
if model.loss_mode == "sample":  # a video model: synthetic latents it takes
    dataset = small_dataset(model)
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
