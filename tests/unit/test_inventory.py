"""controller.inventory: agent and HAMi annotations -> NodeInventory -> GPU capacity."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from controller.domain import (
    GPU_INVENTORY_ANNOTATION,
    HAMI_NODE_REGISTER_ANNOTATION,
    CapacitySource,
    GpuDevice,
    NodeInventory,
)
from controller.inventory import (
    AgentGpu,
    AgentInventory,
    InventoryFormatError,
    MigInstance,
    decode_agent_inventory,
    encode_agent_inventory,
    freshness_problem,
    gpu_capacity,
    gpumem_fraction,
    parse_hami_register,
    parse_node_inventories,
    parse_node_inventory,
    parse_node_sources,
    resolve_gpu_capacity,
    summarize_capacity,
)

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
MAX_AGE = timedelta(minutes=10)
H100 = "NVIDIA H100 80GB HBM3"


def node(name: str = "gpu-1", **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": "u-" + name, "annotations": annotations}}


def agent_ann(text: str) -> dict[str, str]:
    return {GPU_INVENTORY_ANNOTATION: text}


def hami_ann(text: str) -> dict[str, str]:
    return {HAMI_NODE_REGISTER_ANNOTATION: text}


def with_anns(name: str = "gpu-1", *parts: dict[str, str]) -> dict[str, Any]:
    merged: dict[str, str] = {}
    for p in parts:
        merged.update(p)
    return {"metadata": {"name": name, "annotations": merged}}


def inventory(
    n: int = 2, observed: datetime = NOW, unhealthy: tuple[int, ...] = ()
) -> AgentInventory:
    return AgentInventory(
        observed=observed,
        driver="550.54.15",
        gpus=tuple(
            AgentGpu(
                uuid=f"GPU-{i:04d}",
                index=i,
                model=H100,
                memory_mib=81559,
                healthy=i not in unhealthy,
                reasons=("temperature above 85C",) if i in unhealthy else (),
            )
            for i in range(n)
        ),
    )


# ------------------------------------------------------------------ agent format


def test_agent_round_trip_is_compact_and_deterministic() -> None:
    inv = AgentInventory(
        observed=NOW,
        driver="550.54.15",
        gpus=(
            AgentGpu("GPU-b", 1, H100, 81559, healthy=False, reasons=("uncorrectable ECC errors",)),
            AgentGpu(
                "GPU-a",
                0,
                "NVIDIA A100-SXM4-40GB",
                40960,
                mig_enabled=True,
                mig_instances=(MigInstance("MIG-1", "3g.20gb", 19968, 1, 0),),
            ),
        ),
    )
    text = encode_agent_inventory(inv)
    raw = json.loads(text)
    assert text == json.dumps(raw, separators=(",", ":"), sort_keys=True)  # compact, sorted
    assert raw["v"] == 1
    assert raw["observed"] == "2025-06-01T12:00:00Z"
    assert [g["index"] for g in raw["gpus"]] == [0, 1]  # sorted by index
    assert raw["gpus"][0]["migInstances"] == [
        {"uuid": "MIG-1", "profile": "3g.20gb", "memMiB": 19968, "gi": 1, "ci": 0}
    ]
    assert "reasons" not in raw["gpus"][0] and "mig" not in raw["gpus"][1]  # empties omitted
    back = decode_agent_inventory(text)
    assert back.observed == NOW
    assert {g.uuid: g for g in back.gpus} == {g.uuid: g for g in inv.gpus}
    assert encode_agent_inventory(back) == text


def test_content_key_ignores_the_timestamp_only() -> None:
    a = inventory(2, NOW)
    b = inventory(2, NOW + timedelta(hours=1))
    assert a.content_key() == b.content_key()
    assert encode_agent_inventory(a) != encode_agent_inventory(b)
    assert inventory(2, unhealthy=(1,)).content_key() != a.content_key()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", ""),
        ("[]", ""),
        ('{"observed":"2025-06-01T12:00:00Z","gpus":[]}', "$.v"),
        ('{"v":2,"observed":"2025-06-01T12:00:00Z","gpus":[]}', "$.v"),
        ('{"v":1,"gpus":[]}', "$.observed"),
        ('{"v":1,"observed":"yesterday","gpus":[]}', "$.observed"),
        ('{"v":1,"observed":"2025-06-01T12:00:00","gpus":[]}', "$.observed"),
        ('{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":{}}', "$.gpus"),
        ('{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[1]}', "$.gpus[0]"),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"index":0,"healthy":true}]}',
            "$.gpus[0].uuid",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"","index":0,"healthy":true}]}',
            "$.gpus[0].uuid",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":-1,"healthy":true}]}',
            "$.gpus[0].index",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0,"healthy":"yes"}]}',
            "$.gpus[0].healthy",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":true,"healthy":true}]}',
            "$.gpus[0].index",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0,"healthy":true,'
            '"memMiB":1.5}]}',
            "$.gpus[0].memMiB",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0,"healthy":true,'
            '"reasons":[1]}]}',
            "$.gpus[0].reasons",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0,"healthy":true,'
            '"migInstances":[{"profile":"1g"}]}]}',
            "$.gpus[0].migInstances[0].uuid",
        ),
        (
            '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0,"healthy":true},'
            '{"uuid":"G","index":1,"healthy":true}]}',
            "$.gpus",
        ),
    ],
)
def test_decode_agent_rejects_malformed(text: str, field: str) -> None:
    with pytest.raises(InventoryFormatError) as exc:
        decode_agent_inventory(text)
    assert exc.value.field == field


# ------------------------------------------------------------------ HAMi formats

HAMI_JSON = json.dumps(
    [
        {
            "id": "GPU-0",
            "count": 10,
            "devmem": 81559,
            "devcore": 100,
            "type": "NVIDIA-H100",
            "health": True,
        },  # index 0 and numa 0 omitted, as HAMi's Go encoder does
        {
            "id": "GPU-1",
            "count": 10,
            "devmem": 81559,
            "devcore": 100,
            "type": "NVIDIA-H100",
            "numa": 1,
            "health": True,
            "index": 1,
            "mode": "hami-core",
        },
        {
            "id": "GPU-2",
            "count": 10,
            "devmem": 81559,
            "devcore": 100,
            "type": "NVIDIA-H100",
            "numa": 1,
            "index": 2,
        },  # health false omitted
    ]
)


def test_hami_json_defaults_omitted_zero_fields() -> None:
    devices = parse_hami_register(HAMI_JSON)
    assert devices[0] == GpuDevice("GPU-0", 0, "NVIDIA-H100", 81559, 10, 100, True)
    assert devices[1].index == 1 and devices[1].healthy
    assert devices[2] == GpuDevice("GPU-2", 2, "NVIDIA-H100", 81559, 10, 100, False)


def test_hami_json_minimal_entry() -> None:
    (d,) = parse_hami_register('[{"id":"GPU-x"}]')
    assert d == GpuDevice("GPU-x", 0, "", 0, 0, 0, False)


def test_hami_csv_both_lengths() -> None:
    text = (
        "GPU-0,10,81559,100,NVIDIA-H100,0,true:"
        "GPU-1,10,81559,100,NVIDIA-H100,1,false,1,hami-core:"
        "GPU-2,4,40960,100,NVIDIA-A100,0,True,5:"
    )
    devices = parse_hami_register(text)
    assert [d.uuid for d in devices] == ["GPU-0", "GPU-1", "GPU-2"]
    assert [d.healthy for d in devices] == [True, False, True]
    assert [d.index for d in devices] == [0, 1, 5]
    assert devices[2] == GpuDevice("GPU-2", 5, "NVIDIA-A100", 40960, 4, 100, True)


def test_hami_csv_without_trailing_colon_and_empty() -> None:
    assert len(parse_hami_register("GPU-0,10,81559,100,NVIDIA-H100,0,true")) == 1
    assert parse_hami_register("") == ()
    assert parse_hami_register("[]") == ()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("GPU-0,10,81559:", "[0]"),
        ("GPU-0,10,lots,100,H100,0,true:", "[0].devmem"),
        ("GPU-0,-1,81559,100,H100,0,true:", "[0].count"),
        ("GPU-0,10,81559,100,H100,0,maybe:", "[0].health"),
        (",10,81559,100,H100,0,true:", "[0].id"),
        ("GPU-0,10,81559,100,H100,0,true:GPU-0,10,81559,100,H100,0,true:", ""),
        ("[{", ""),
        ('{"id":"GPU-0"}', "[0]"),  # not an array: read as CSV, which it is not either
        ('[{"count":10}]', "[0].id"),
        ('[{"id":"GPU-0","devmem":"81559"}]', "[0].devmem"),
        ('[{"id":"GPU-0","health":"true"}]', "[0].health"),
        ('[{"id":"GPU-0","count":-2}]', "[0].count"),
        ('["GPU-0"]', "[0]"),
    ],
)
def test_hami_rejects_malformed(text: str, field: str) -> None:
    with pytest.raises(InventoryFormatError) as exc:
        parse_hami_register(text)
    assert exc.value.field == field


# ------------------------------------------------------------------ source selection


def test_fresh_agent_annotation_wins_over_hami() -> None:
    n = with_anns(
        "gpu-1",
        agent_ann(encode_agent_inventory(inventory(2, NOW - timedelta(minutes=5)))),
        hami_ann(HAMI_JSON),
    )
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert problems == []
    assert inv is not None
    assert inv.source is CapacitySource.AGENT
    assert inv.node == "gpu-1"
    assert inv.observed == NOW - timedelta(minutes=5)
    assert inv.healthy_gpus == 2


def test_agent_gpus_keep_hami_split_count_by_uuid() -> None:
    hami = json.dumps([{"id": "GPU-0000", "count": 4, "devmem": 1, "devcore": 50, "health": True}])
    n = with_anns("gpu-1", agent_ann(encode_agent_inventory(inventory(2))), hami_ann(hami))
    inv, _ = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is not None
    assert (inv.gpus[0].split_count, inv.gpus[0].cores) == (4, 50)
    assert (inv.gpus[1].split_count, inv.gpus[1].cores) == (10, 100)
    assert inv.gpus[0].memory_mib == 81559  # memory from the agent, not HAMi


def test_stale_agent_annotation_falls_back_to_hami_with_a_problem() -> None:
    old = NOW - timedelta(minutes=11)
    n = with_anns(
        "gpu-1", agent_ann(encode_agent_inventory(inventory(2, old))), hami_ann(HAMI_JSON)
    )
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is not None and inv.source is CapacitySource.HAMI
    assert inv.healthy_gpus == 2  # GPU-2 has health omitted = false
    (p,) = problems
    assert p.object is not None and p.object.name == "gpu-1" and p.object.kind == "Node"
    assert p.field == f"metadata.annotations[{GPU_INVENTORY_ANNOTATION}].observed"
    assert "stale" in p.message and "11m" in p.message
    assert "gpu-1" in str(p)


def test_agent_annotation_exactly_at_max_age_is_fresh() -> None:
    n = node(**agent_ann(encode_agent_inventory(inventory(1, NOW - MAX_AGE))))
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is not None and problems == []


def test_agent_annotation_far_in_the_future_is_not_trusted() -> None:
    n = node(**agent_ann(encode_agent_inventory(inventory(1, NOW + timedelta(hours=1)))))
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is None
    assert "future" in problems[0].message
    # a little skew is fine
    n = node(**agent_ann(encode_agent_inventory(inventory(1, NOW + timedelta(seconds=30)))))
    assert parse_node_inventory(n, NOW, MAX_AGE)[0] is not None


def test_malformed_agent_annotation_names_node_and_field_and_falls_back() -> None:
    bad = '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0}]}'
    n = with_anns("gpu-7", agent_ann(bad), hami_ann("GPU-0,10,81559,100,H100,0,true:"))
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is not None and inv.source is CapacitySource.HAMI and inv.healthy_gpus == 1
    (p,) = problems
    assert p.object is not None and p.object.name == "gpu-7"
    assert p.field == f"metadata.annotations[{GPU_INVENTORY_ANNOTATION}].gpus[0].healthy"
    assert "missing" in p.message and "node agent" in p.message


def test_malformed_both_gives_none_and_two_problems() -> None:
    n = with_anns("gpu-7", agent_ann("{"), hami_ann("garbage"))
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is None
    fields = sorted(p.field for p in problems)
    assert fields == sorted(
        [
            f"metadata.annotations[{GPU_INVENTORY_ANNOTATION}]",
            f"metadata.annotations[{HAMI_NODE_REGISTER_ANNOTATION}][0]",
        ]
    )
    assert all(p.object is not None and p.object.name == "gpu-7" for p in problems)


def test_long_values_are_shortened_in_problems() -> None:
    n = node(**hami_ann("x" * 5000))
    _, (p,) = parse_node_inventory(n, NOW, MAX_AGE)
    assert len(p.value) < 200


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"metadata": None},
        {"metadata": {"name": "n"}},
        {"metadata": {"name": "n", "annotations": None}},
        {"metadata": {"name": "n", "annotations": {"other": "x"}}},
    ],
)
def test_nodes_without_inventory(obj: dict[str, Any]) -> None:
    inv, _ = parse_node_inventory(obj, NOW, MAX_AGE)
    assert inv is None


def test_non_string_annotation_values_and_unnamed_node() -> None:
    obj = {
        "metadata": {
            "annotations": {GPU_INVENTORY_ANNOTATION: 5, HAMI_NODE_REGISTER_ANNOTATION: []}
        }
    }
    inv, problems = parse_node_inventory(obj, NOW, MAX_AGE)
    assert inv is None
    assert {p.field for p in problems} == {
        "metadata.name",
        f"metadata.annotations[{GPU_INVENTORY_ANNOTATION}]",
        f"metadata.annotations[{HAMI_NODE_REGISTER_ANNOTATION}]",
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "null",
        "[null]",
        '{"v":1}',
        "\x00\xff",
        "[" * 5000,
        '{"v":1,"observed":5,"gpus":[]}',
        '{"v":1,"observed":"2025-06-01T12:00:00Z","gpus":[{"uuid":"G","index":0,"healthy":true,'
        '"migInstances":{}}]}',
    ],
)
def test_parse_never_raises_on_garbage(text: str) -> None:
    inv, problems = parse_node_inventory(node(**agent_ann(text), **hami_ann(text)), NOW, MAX_AGE)
    if inv is None:
        assert problems
    assert all(p.object is not None and p.object.name == "gpu-1" for p in problems)


def test_unhealthy_agent_gpus_do_not_count() -> None:
    n = node(**agent_ann(encode_agent_inventory(inventory(8, unhealthy=(3, 5)))))
    inv, problems = parse_node_inventory(n, NOW, MAX_AGE)
    assert inv is not None and problems == []
    assert len(inv.gpus) == 8
    assert inv.healthy_gpus == 6
    assert gpu_capacity([inv]) == Decimal(6)


def test_parse_node_sources_keeps_both_for_accounting_to_choose() -> None:
    old = NOW - timedelta(hours=3)
    n = with_anns(
        "gpu-1", agent_ann(encode_agent_inventory(inventory(2, old))), hami_ann(HAMI_JSON)
    )
    found, problems = parse_node_sources(n)
    assert problems == []
    assert [i.source for i in found] == [CapacitySource.AGENT, CapacitySource.HAMI]
    assert found[0].observed == old and found[1].observed is None
    stale = freshness_problem(found[0], NOW, MAX_AGE)
    assert stale is not None and "3h old" in stale.message
    assert freshness_problem(found[1], NOW, MAX_AGE) is None  # HAMi has no timestamp


# ------------------------------------------------------------------ capacity


def test_capacity_over_mixed_sources() -> None:
    nodes = [
        node("a", **agent_ann(encode_agent_inventory(inventory(8, unhealthy=(0,))))),
        node("b", **hami_ann(HAMI_JSON)),
        node("c"),
        node("d", **hami_ann("bad,bad")),
    ]
    invs, problems = parse_node_inventories(nodes, NOW, MAX_AGE)
    assert [i.node for i in invs] == ["a", "b"]
    assert len(problems) == 1 and problems[0].object is not None and problems[0].object.name == "d"
    summary = summarize_capacity(invs)
    assert summary.gpus == Decimal(7 + 2)
    assert gpu_capacity(invs) == summary.gpus
    assert summary.unhealthy == 2
    assert summary.gpus_by_model == {H100: 7, "NVIDIA-H100": 2}
    assert summary.source is CapacitySource.HAMI  # the weakest source in use
    assert dict(summary.sources) == {"a": CapacitySource.AGENT, "b": CapacitySource.HAMI}
    assert resolve_gpu_capacity(invs, Decimal(100)) == (Decimal(9), CapacitySource.HAMI)


def test_capacity_falls_back_to_quota() -> None:
    assert resolve_gpu_capacity([], Decimal(16)) == (Decimal(16), CapacitySource.QUOTA)
    assert summarize_capacity([]).source is CapacitySource.QUOTA
    agent_only = [NodeInventory("a", CapacitySource.AGENT, (GpuDevice("G", 0, "m", 1),))]
    assert resolve_gpu_capacity(agent_only, Decimal(16)) == (Decimal(1), CapacitySource.AGENT)


def test_card_memory_for_gpumem_fractions() -> None:
    invs = (
        NodeInventory(
            "a",
            CapacitySource.AGENT,
            (
                GpuDevice("G1", 0, "NVIDIA H100 80GB HBM3", 81559),
                GpuDevice("G2", 1, "NVIDIA A100-SXM4-40GB", 40960),
                GpuDevice("G3", 2, "NVIDIA A100-SXM4-40GB", 40000, healthy=False),
            ),
        ),
    )
    summary = summarize_capacity(invs)
    assert summary.card_memory_mib() == 40960  # smallest healthy card
    assert summary.card_memory_mib("h100") == 81559
    assert summary.card_memory_mib("B200") is None
    assert gpumem_fraction(Decimal(20480), 40960) == Decimal("0.5")
    assert gpumem_fraction(Decimal(99999), 40960) == Decimal(1)
    assert gpumem_fraction(Decimal(0), 40960) == Decimal(0)
    with pytest.raises(ValueError):
        gpumem_fraction(Decimal(1), 0)
