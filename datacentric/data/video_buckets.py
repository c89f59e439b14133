"""Facts of the public Open-Sora v1.2 / VideoSys DCP benchmark, as data.

Transcribed from the benchmark configuration of the DCP reference code
(``examples/training/open_sora/configs/benchmarks/*.yaml`` in NUS-HPC-AI-Lab/VideoSys):
the benchmark dataset's size, bucket frequencies and image mixing, and the blog's
model and hardware. The bucket resolutions, frame counts and latent geometry live in
:mod:`datacentric.data.video_geometry`. The workload presets in :mod:`datacentric.data.workloads`
are built from both.
"""

from __future__ import annotations

#: Videos in the reference benchmark dataset.
BENCHMARK_VIDEOS = 2000

#: Exclusive image mixing: images added per video (``image_mixing_frac`` of the
#: DCP-inter+PAC benchmark config).
IMAGES_PER_VIDEO = 50

#: Zipf exponent and offset of the reference benchmark over video buckets sorted by
#: frames x pixels (offset 5 in the DCP-inter+PAC config).
ZIPF_ALPHA = 3.0
ZIPF_OFFSET = 5

#: Model of the benchmark (Open-Sora v1.2 STDiT3-XL/2, 1.1B parameters, bf16).
BENCHMARK_MODEL = "stdit-1.1b"

#: Hardware of the blog's table: 32 x H100 SXM, NVLink in nodes of 8, InfiniBand across.
BENCHMARK_HARDWARE = "h100-sxm"
