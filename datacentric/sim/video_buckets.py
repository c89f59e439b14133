"""Facts of the public Open-Sora v1.2 / VideoSys DCP benchmark, as data.

Transcribed from the benchmark configuration of the DCP reference code
(``examples/training/open_sora/configs/benchmarks/*.yaml`` in NUS-HPC-AI-Lab/VideoSys):
bucket resolutions (one aspect ratio, 9:16) and frame counts, the latent geometry of
the Open-Sora v1.2 VAE and STDiT patching, and the benchmark dataset's size and
mixing. The workload presets in :mod:`datacentric.sim.workloads` are built from them.
"""

from __future__ import annotations

#: Pixel ``(height, width)`` of each resolution bucket, in ascending size.
RESOLUTIONS: dict[str, tuple[int, int]] = {
    "144p": (144, 256),
    "240p": (240, 426),
    "360p": (360, 640),
    "480p": (480, 854),
    "720p": (720, 1280),
}

#: Pixel frame counts of the benchmark buckets; 1 frame is an image.
FRAMES: tuple[int, ...] = (1, 51, 102, 204, 408)

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
