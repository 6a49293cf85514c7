"""pdstack_smoke in the inventories: schema defaults, typos rejected, and what `pdstack smoke -i` takes from it."""

from __future__ import annotations

import pytest

from pdstack.controller import inventory, smoke
from pdstack.errors import InventoryError


@pytest.mark.parametrize("inv", ["inventory/production", "inventory/local", "inventory/test/one-host",
                                 "inventory/test/three-host"])
def test_every_inventory_sets_a_smoke_gate(inv):
    s = smoke.settings_from_inventory(inv)
    assert s["min_horizon"] > 0 and s["baseline"] and 0 < s["tolerance"] < 1
    assert s["min_horizon"] in s["lengths"]  # the gate is a grid point, so "within one grid step" holds
    dep = inventory.load(inv)
    assert max(s["bench_concurrency"]) <= max(dep.router["admission"]["max_concurrent_requests"], 8)


def test_smoke_schema_defaults_and_typos():
    hv, groups = inventory.load_hostvars("inventory/local")
    for h in hv.values():
        h.pop("pdstack_smoke", None)
    dep = inventory.build_deployment(hv, groups)
    assert dep.smoke["min_horizon"] == 0 and dep.smoke["bench"]["tolerance"] == 0.2
    for h in hv.values():
        h["pdstack_smoke"] = {"min_horizon": 4000, "bench": {"baseline": 64}}
    with pytest.raises(InventoryError, match="did you mean 'baseline_tps'"):
        inventory.build_deployment(hv, groups)
