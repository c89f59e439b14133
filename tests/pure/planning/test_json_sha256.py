"""``json_sha256``, the digest of a saved profile's fingerprint and of a model's
identity, is the same bytes as before it was one helper: each literal below was
computed the old way (``hashlib.sha256(json.dumps(value, sort_keys=True).encode())``
for a fingerprint, the same with ``default=str`` for an identity)."""

from __future__ import annotations

from datacentric.planning.spec_derivation import json_sha256

#: A fingerprint as ``profiling.store`` records one: nested keys out of order, a
#: non-ASCII name, a float, None and lists.
FINGERPRINT = {
    "model": "stdit-1.1b",
    "world_size": 8,
    "dtype": "bf16",
    "device_name": "NVIDIA H100 80GB HBM3",
    "model_config": {
        "hidden_size": 1152,
        "depth": 28,
        "name": "Café ü",
        "ratio": 0.5,
        "none": None,
        "shapes": [[1, 2], [3]],
    },
    "profiler_method": 3,
    "backend": "nccl",
    "torch": "2.5.1",
}


class Dtype:
    """A config value JSON has no form for (a torch dtype in a Hugging Face config)."""

    def __str__(self) -> str:
        return "torch.bfloat16"


def test_a_fingerprint_hashes_as_saved_profiles_hold_it():
    digest = "28a1354adcdcb4b4205528e8c368e84297851061875030805fa6343a3ca3215c"
    assert json_sha256(FINGERPRINT) == digest
    assert json_sha256(dict(reversed(FINGERPRINT.items()))) == digest  # keys sorted


def test_an_identity_hashes_a_value_json_has_no_form_for_as_its_text():
    config = {
        "torch_dtype": Dtype(),
        "hidden_size": 4096,
        "architectures": ["LlamaForCausalLM"],
        "rope": {"type": "linear", "factor": 2.0},
    }
    shapes = [("embed.weight", [32000, 4096]), ("blocks.0.attn.qkv.weight", [12288, 4096])]
    assert json_sha256(config) == "a4adf0c4fb58f6cb9cf2ef393fd6fd24d0a23e406867397abd94b05ee8992c6a"
    assert json_sha256(shapes) == "efac3ed0b0fa4e7a8ce122d34dcafd5b2a1f7c8c751d4b0fc435e0ba5a9ea14b"
