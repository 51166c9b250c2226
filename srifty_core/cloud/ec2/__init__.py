"""EC2 itself, through the Airflow Amazon provider (``EC2Provider``, which
``cloud.provider_class("ec2")`` finds here). Its parts: ``provider`` (launch, release,
observe), ``launch_args`` (one ``run_instances`` call's arguments), ``records`` (what
EC2's records say: states, interruptions, exit codes, tags), ``user_data`` (what a VM
runs at boot: the deployment's wheel, then the worker or a start script) and ``prices``
(spot prices into the catalog's overlay). Importing it loads neither Airflow nor boto3.
"""

from srifty_core.cloud.ec2.provider import EC2Provider

__all__ = ["EC2Provider"]
