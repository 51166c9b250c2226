"""Sharded data parallelism: the strategies a plan may choose (``ddp``, ``fsdp``, ``hsdp``),
what each holds per rank (``memory``) and which modules are sharded as one unit
(``units``, torch)."""
