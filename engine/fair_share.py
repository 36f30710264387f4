"""Fair share between tenants: virtual token counters (VTC).

"Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024): each tenant has a
counter of the service it received, in tokens (prompt tokens computed plus output tokens),
divided by its weight. Within a priority class the scheduler admits the waiting request of
the tenant whose counter is lowest, and preempts from the one whose counter is highest, so
two backlogged tenants of weights 1 and 3 get tokens in a 1:3 ratio whatever their
request rates or sizes.

NOTE (the lift rule): a tenant that becomes active again (a request arrives while it has
none waiting or running) starts at max(its own counter, the lowest counter of the active
tenants): time spent idle is not banked as credit that would later let it take the whole
engine. When no tenant is active, the floor is the counter of the last one to leave.

Counters are per engine (per worker): a deployment of N workers is fair on each worker
over what that worker holds, and so only approximately across workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from inflight.engine.errors import ConfigError


@dataclass(eq=False, slots=True)
class TenantShare:
    """One tenant's counter: `service` grows by tokens / weight as the tenant's requests
    are scheduled; `num_active` counts its requests waiting or running."""

    name: str | None
    weight: float = 1.0
    inv_weight: float = 1.0
    service: float = 0.0
    num_active: int = 0
    num_running: int = 0  # of those, running (the scheduler keeps it)


def parse_weights(value: Mapping[str, float] | str | Iterable | None) -> tuple[tuple[str, float], ...]:
    """Tenant weights as sorted (tenant, weight) pairs, from a mapping, its JSON text
    (INFLIGHT_TENANT_WEIGHTS='{"team-a": 1, "team-b": 3}') or pairs; ConfigError when bad."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"tenant_weights is not valid JSON ({exc}); give an object such "
                              'as {"team-a": 1, "team-b": 3}') from None
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = sorted((str(k), float(v)) for k, v in items)
    except (TypeError, ValueError):
        raise ConfigError("tenant_weights: give {tenant: weight}, weights numbers "
                          f"(got {value!r:.200})") from None
    for name, w in pairs:
        if not w > 0 or w == float("inf"):
            raise ConfigError(f"tenant_weights[{name!r}]={w}: weights must be positive numbers")
    return tuple(pairs)


class FairShare:
    """Every tenant's counter, the lift rule and who is active (see the module doc)."""

    def __init__(self, weights: Iterable[tuple[str, float]] = (), default_weight: float = 1.0):
        self.weights = dict(weights)
        self.default_weight = default_weight
        self.shares: dict[str | None, TenantShare] = {}
        self.active: set[TenantShare] = set()
        self.floor = 0.0  # the last active tenant's counter when every tenant went idle

    def share(self, tenant: str | None) -> TenantShare:
        share = self.shares.get(tenant)
        if share is None:
            w = self.weights.get(tenant, self.default_weight) if tenant is not None else self.default_weight
            share = self.shares[tenant] = TenantShare(tenant, w, 1.0 / w)
        return share

    def join(self, share: TenantShare) -> None:
        """One more request of this tenant is waiting or running (lift when it was idle)."""
        if share.num_active == 0:
            low = min((s.service for s in self.active), default=self.floor)
            if share.service < low:
                share.service = low
            self.active.add(share)
        share.num_active += 1

    def leave(self, share: TenantShare) -> None:
        """One of its requests finished (or was aborted, or failed)."""
        share.num_active -= 1
        if share.num_active == 0:
            self.active.discard(share)
            if not self.active:
                self.floor = max(self.floor, share.service)

    def snapshot(self) -> dict[str | None, float]:
        """{tenant: weighted service so far} (tests, benchmarks)."""
        return {name: s.service for name, s in self.shares.items()}
