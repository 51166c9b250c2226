"""What runs on a training VM: the built-in worker (``worker``), the API a user's training
script calls (``user``), the launcher that starts either on every rank (``launch``,
``rendezvous``, ``placement``), checkpoints (``checkpoint``, ``sharded_checkpoint``), the
gradient-exchange timer and the batch arithmetic (``batches``). Import submodules directly;
most load torch. The control plane that plans, starts and watches them is ``jobs``."""
