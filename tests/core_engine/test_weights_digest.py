"""The per-update weight digest: any changed element or swapped pair changes it."""

import torch

from core_engine.weights import update_digest, weights_checksum, weights_fingerprint


def weight_set(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(1000, generator=gen),
        "b": torch.randn(30, 7, generator=gen).to(torch.bfloat16),
        "c": torch.randint(0, 5, (11,), generator=gen),
    }


def test_fingerprint_changes_with_any_element_a_swap_a_name_or_a_dtype():
    base = weight_set()
    fingerprint = weights_fingerprint(base)
    assert weights_fingerprint({k: v.clone() for k, v in base.items()}) == fingerprint
    nudged = {k: v.clone() for k, v in base.items()}
    nudged["a"][517] = torch.nextafter(nudged["a"][517], torch.tensor(9.0))
    swapped = {k: v.clone() for k, v in base.items()}
    swapped["b"][3, 1], swapped["b"][3, 2] = base["b"][3, 2], base["b"][3, 1]
    renamed = {("z" if k == "a" else k): v for k, v in base.items()}
    retyped = {**base, "a": base["a"].double()}
    for other in (nudged, swapped, renamed, retyped):
        assert weights_fingerprint(other) != fingerprint
    assert swapped["b"][3, 1] != base["b"][3, 1]


def test_the_update_digest_is_the_full_checksum_on_a_cpu():
    base = weight_set()
    assert update_digest(base) == weights_checksum(base)
