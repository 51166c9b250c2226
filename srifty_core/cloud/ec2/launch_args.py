"""The arguments of one ``run_instances`` call: the AMI and network settings, the market
(spot: one-time, terminated on interruption), the tags every instance and volume carries
(``srifty:allocation=<id>``, ``srifty:managed=true``, its market and placement group),
the placement, and the user data. VMs launch with
``InstanceInitiatedShutdownBehavior=terminate``: one that shuts itself down stops billing.
The allocation id is the call's ``ClientToken``, so a retried call launches nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srifty_core.catalog.types import Market
from srifty_core.cloud.ec2.records import TAG_ALLOCATION, TAG_MANAGED, TAG_MARKET, TAG_PLACEMENT


def run_instances_args(
    alloc_id: str,
    instance_type: str,
    count: int,
    market: Market,
    *,
    image_id: str,
    user_data: str | None = None,
    zone_name: str | None = None,
    group: str | None = None,
    subnet_id: str | None = None,
    security_group_ids: Sequence[str] = (),
    key_name: str | None = None,
    instance_profile_arn: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``run_instances`` for ``count`` VMs of ``instance_type`` of
    allocation ``alloc_id``, in zone ``zone_name`` (an AZ name) and placement group
    ``group`` when given."""
    tags = [
        {"Key": TAG_ALLOCATION, "Value": alloc_id},
        {"Key": TAG_MANAGED, "Value": "true"},
        {"Key": TAG_MARKET, "Value": market.value},
        {"Key": TAG_PLACEMENT, "Value": group or "false"},
    ]
    kwargs: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": alloc_id,
        # a VM that shuts itself down (the training start script, once torchrun
        # ended) is terminated: nothing of it keeps billing
        "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
    }
    if user_data is not None:
        kwargs["UserData"] = user_data
    if subnet_id:
        kwargs["SubnetId"] = subnet_id
    if security_group_ids:
        kwargs["SecurityGroupIds"] = list(security_group_ids)
    if key_name:
        kwargs["KeyName"] = key_name
    if instance_profile_arn:
        kwargs["IamInstanceProfile"] = {"Arn": instance_profile_arn}
    if market is Market.SPOT:
        kwargs["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    placement: dict[str, str] = {}
    if zone_name:
        placement["AvailabilityZone"] = zone_name
    if group is not None:
        placement["GroupName"] = group
    if placement:
        kwargs["Placement"] = placement
    return kwargs
