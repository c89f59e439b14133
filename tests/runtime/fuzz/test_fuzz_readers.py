"""Every file kind the package reads, fuzzed: seeded mutants of a valid file (truncated,
bytes flipped, deep nesting, huge numbers, odd Unicode line breaks, a BOM, CRLF, JSON
values of another kind) and special files in its place (a FIFO, a folder, a symlink out of
its folder, nothing), each read by the package's own reader in this process: accepted
with the valid file's value (or any value, where the mutant changed the meaning), or
refused in one line naming the file (:mod:`fuzz_inputs`). ``DATACENTRIC_FUZZ_EXAMPLES=N``
runs N mutants a kind."""

from __future__ import annotations

import pytest
from fuzz_inputs import fuzz
from fuzz_targets import TARGETS


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_every_mutant_is_read_as_its_valid_form_or_refused_naming_the_file(target, tmp_path):
    if target.name == "parquet":
        pytest.importorskip("pyarrow")
    if target.name in ("tokenizer.json", "chat template", "hf config.json"):
        pytest.importorskip("transformers")
    problems = fuzz(target, tmp_path)
    assert not problems, f"{len(problems)} problems, the first ten:\n" + "\n".join(problems[:10])
