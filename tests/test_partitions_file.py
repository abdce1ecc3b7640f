"""SM partitions and stream priorities in the tokens file: read, and refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from accyd.backends.partitions import PartitionSpec, deal_groups
from accyd.core.tenants import Placement, Quotas
from accyd.errors import CatalogError
from accyd.tokens import TokenTable, hash_token

DIGEST = hash_token("t")


def load(tmp_path: Path, text: str) -> TokenTable:
    path = tmp_path / "tokens.toml"
    path.write_text(text + f'\n[[token]]\ntenant = "a"\nsha256 = "{DIGEST}"\n')
    return TokenTable.load(path)


def test_partitions_and_placements_are_read(tmp_path: Path) -> None:
    table = load(
        tmp_path,
        """
[partitions]
batch = { sms = 64 }
half = { share = 0.5 }

[tenant.a]
partition = "batch"
priority = 2
sessions = 4

[tenant.b]
sm_share = 0.25

[tenant.c]
priority = 5
""",
    )
    assert table.partitions == (
        PartitionSpec("batch", sms=64),
        PartitionSpec("half", share=0.5),
        PartitionSpec("tenant.b", share=0.25),
    )
    assert table.placements == {
        "a": Placement("batch", 2),
        "b": Placement("tenant.b", 0),
        "c": Placement(None, 5),
    }
    assert table.tenant_quotas == {"a": Quotas(sessions=4)}  # placement fields are no quotas


def test_a_file_without_partitions_has_none(tmp_path: Path) -> None:
    table = load(tmp_path, "[tenant.a]\nsessions = 2\n")
    assert table.partitions == () and table.placements == {}


@pytest.mark.parametrize(
    ("text", "where", "field", "says"),
    [
        ("[partitions]\nbatch = { sms = 0 }", "[partitions.batch]", "sms", "positive whole"),
        ("[partitions]\nbatch = { sms = true }", "[partitions.batch]", "sms", "positive whole"),
        ("[partitions]\nbatch = { sms = 8.5 }", "[partitions.batch]", "sms", "positive whole"),
        ("[partitions]\nbatch = { share = 1.5 }", "[partitions.batch]", "share", "below 1"),
        ("[partitions]\nbatch = { share = 0 }", "[partitions.batch]", "share", "above 0"),
        ("[partitions]\nb = { sms = 8, share = 0.5 }", "[partitions.b]", "sms", "exactly one"),
        ("[partitions]\nbatch = {}", "[partitions.batch]", "sms", "exactly one"),
        ("[partitions]\nb = { sms = 8, smz = 1 }", "[partitions.b]", "smz", "not a known"),
        ("[partitions]\nb = 3", "[partitions.b]", "b", "must be a table"),
        ('[partitions]\n"a.b" = { sms = 8 }', "[partitions.a.b]", "name", "letters, digits"),
        ('[tenant.a]\npartition = "nope"', "[tenant.a]", "partition", "defined: none"),
        ("[tenant.a]\npartition = 3", "[tenant.a]", "partition", "must name a table"),
        (
            '[partitions]\nx = { sms = 8 }\n[tenant.a]\npartition = "x"\nsm_share = 0.5',
            "[tenant.a]",
            "sm_share",
            "not both",
        ),
        ("[tenant.a]\nsm_share = 1", "[tenant.a]", "sm_share", "below 1"),
        ("[tenant.a]\nsm_share = 'half'", "[tenant.a]", "sm_share", "share of the GPU"),
        ("[tenant.a]\npriority = 6", "[tenant.a]", "priority", "from 0 (the default) to 5"),
        ("[tenant.a]\npriority = -1", "[tenant.a]", "priority", "from 0 (the default) to 5"),
        ("[tenant.a]\npriority = 1.5", "[tenant.a]", "priority", "whole number"),
    ],
)
def test_bad_values_are_refused_naming_the_file_the_table_and_the_field(
    tmp_path: Path, text: str, where: str, field: str, says: str
) -> None:
    with pytest.raises(CatalogError) as refused:
        load(tmp_path, text)
    message = str(refused.value)
    assert str(tmp_path / "tokens.toml") in message
    assert where in message and f"field {field!r}" in message and says in message, message


def test_shares_past_the_whole_gpu_are_refused(tmp_path: Path) -> None:
    text = "[partitions]\nx = { share = 0.6 }\n[tenant.a]\nsm_share = 0.5\n"
    with pytest.raises(CatalogError, match=r"add up to more than the whole GPU \(x 0.6, tenant.a"):
        load(tmp_path, text)


def test_an_unknown_top_level_table_names_partitions_among_those_expected(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"\[partitions\]"):
        load(tmp_path, "[partition.x]\nsms = 8\n")


def test_sms_are_dealt_in_whole_steps_in_order() -> None:
    specs = [PartitionSpec("a", sms=64), PartitionSpec("b", share=0.25), PartitionSpec("c", sms=3)]
    assert deal_groups(specs, 132, 8) == [8, 4, 1]  # 64; 33 -> 32; 3 -> at least one step
    with pytest.raises(ValueError, match=r"ask for 136 SMs \(a: 128, b: 8\), more than .* 128"):
        deal_groups([PartitionSpec("a", sms=128), PartitionSpec("b", sms=8)], 132, 8)
    with pytest.raises(ValueError, match="less than one step"):
        deal_groups(specs, 4, 8)
