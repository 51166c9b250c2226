"""The control plane's jobs (no torch): ``profile_vms`` profiles a model on one cloud VM
per offered GPU type. The rest of the control plane is ``srifty_core.runtime`` until it
moves here (docs/design/README.md)."""
