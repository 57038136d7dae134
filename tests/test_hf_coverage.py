"""Every MoE model type transformers ships (`tests/fixtures/hf_coverage.json`, written by `scripts/hf_coverage.py
scan` from transformers 5.24's ``models/``) is either handled and tested against transformers' own block, or refused
with the mechanism the layer lacks; docs/hf.md's coverage table says which, for each.

A handled type is tested by its own fixture (`tests/test_hf_import.py`) or through its twin's (the same block under
another config layout: a text model's config nested in a multimodal one, or flat; `Family.twin`): here its config,
built from the twin's keys, must import to the twin's block, and its tensors must load and export under its own
prefixes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tempo_jax.hf import FAMILIES, REFUSED, load_moe_layers, moe_config_from_hf, moe_layer_ids, save_moe_layers
from tempo_jax.layer.hf.families import family
from tempo_jax.layer.params import to_logical

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import hf_coverage  # noqa: E402

SCAN = json.loads(hf_coverage.SCAN.read_text())
TYPES = hf_coverage.model_types(SCAN)
TWINS = sorted(t for t in TYPES if t in FAMILIES and hf_coverage.tested_through(t) not in (t, None))


def test_the_scan_is_of_transformers_5_24_and_lists_every_family_the_layer_claims():
    assert SCAN["transformers"] == "5.24.0"
    assert len(TYPES) >= 90
    assert set(FAMILIES) <= set(TYPES), sorted(set(FAMILIES) - set(TYPES))  # no family that transformers lacks
    assert not set(FAMILIES) & set(REFUSED)


@pytest.mark.parametrize("mt", TYPES)
def test_every_moe_model_type_is_tested_or_refused_by_name(mt):
    """Handled: a fixture tests it (its own or its twin's). Refused: ``moe_config_from_hf`` raises with the
    mechanism the layer lacks."""
    if mt in FAMILIES:
        assert hf_coverage.tested_through(mt) is not None, f"{mt} is handled but no fixture tests it"
        return
    assert mt in REFUSED, f"{mt}: neither handled (FAMILIES) nor refused with a reason (REFUSED)"
    with pytest.raises(
        ValueError, match=re.escape(f"the {mt} MoE block cannot be expressed by the layer: {REFUSED[mt]}")
    ):
        moe_config_from_hf({"model_type": mt, "hidden_size": 16}, slots_per_rank=1)


def _as(mt: str, inner: dict) -> dict:
    """The config.json of type ``mt`` holding the MoE keys ``inner`` where its family reads them."""
    fam = FAMILIES[mt]
    path = fam.nested if isinstance(fam.nested, str) else (fam.nested or ("",))[0]
    config = {**inner, "model_type": mt}
    for key in reversed([k for k in (path or "").split(".") if k]):
        config = {"model_type": mt, key: config}
    return config


@pytest.mark.parametrize("mt", TWINS)
def test_a_type_tested_through_its_twin_reads_the_twins_block_under_its_own_layout(mt, tmp_path):
    """Its config (the twin fixture's MoE keys, placed where this type reads them) imports to the twin's
    `MoEConfig` and MoE layers; the twin's parameters export under this type's prefixes and load back equal."""
    twin = hf_coverage.tested_through(mt)
    root = hf_coverage.FIXTURES / twin
    layer = int(np.load(root / "block.npz")["layer"])
    twin_config = json.loads((root / "hub" / "config.json").read_text())
    cfg, params, placement = load_moe_layers(root / "hub", layers=[layer], sequence_length=24)[layer]
    config = _as(mt, family(twin_config)[2].config)
    assert moe_config_from_hf(config, slots_per_rank=placement.slots_per_rank, layer=layer, sequence_length=24) == cfg
    assert moe_layer_ids(config) == moe_layer_ids(twin_config)
    save_moe_layers(tmp_path, config, {layer: (cfg, to_logical(params, placement))})
    names = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    own = FAMILIES[mt].prefixes_at(family(config)[2], layer)[0]
    assert all(k.startswith(own) for k in names), sorted(names)[:3]
    again = load_moe_layers(tmp_path, layers=[layer], sequence_length=24)[layer]
    assert again.config == cfg
    for k in params:
        np.testing.assert_array_equal(np.asarray(again.params[k]), np.asarray(params[k]), err_msg=k)


def test_the_docs_coverage_table_lists_every_type_with_its_status():
    """docs/hf.md's table (`scripts/hf_coverage.py render`) has one row per scanned type, handled or refused as
    the code says, refusals with the code's reason."""
    text = hf_coverage.DOC.read_text()
    table = text.split(hf_coverage.BEGIN, 1)[1].split(hf_coverage.END, 1)[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    assert sorted(rows) == TYPES
    for mt, cells in rows.items():
        if mt in FAMILIES:
            assert cells[1] == "handled", mt
            assert re.fullmatch(r"\d\.\de-\d\d / \d\.\de-\d\d", cells[6]), (mt, cells[6])
            assert max(map(float, cells[6].split(" / "))) < 1e-5, (mt, cells[6])
        else:
            assert cells[1:3] == ["refused", REFUSED[mt]], mt
