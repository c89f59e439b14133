"""A saved profile's ``fingerprint_sha256`` is the digest profiles on disk hold (computed
the old way, ``hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode())``), so
they still load after the fingerprint's digest became ``planning.spec_derivation``'s."""

from __future__ import annotations

import pytest

from datacentric.profiling.store import Profile, ProfileError

FINGERPRINT = {"model": "gpt2", "world_size": 2, "dtype": "bf16", "torch": "2.5.1"}
#: hashlib.sha256(json.dumps(FINGERPRINT, sort_keys=True).encode()).hexdigest()
DIGEST = "3dab2820ec93fe51eb6e9679216cadfb32b175c13d3874a59605bd2fd46dace0"


def test_a_saved_fingerprint_keeps_its_digest_and_loads():
    profile = Profile(
        fingerprint=FINGERPRINT,
        model="gpt2",
        num_blocks=2,
        attention_kind="sdpa",
        points=(),
        gpus_per_node=8,
    )
    saved = profile.to_json()
    assert saved["fingerprint_sha256"] == DIGEST
    assert Profile.from_json(saved).fingerprint == FINGERPRINT
    with pytest.raises(ProfileError, match="checksum"):
        Profile.from_json(saved | {"fingerprint_sha256": DIGEST[::-1]})
