"""The control plane's jobs (no torch): ``profile_vms`` profiles a model on one cloud VM
per offered GPU type (its request ``cloud_request``, the VM's life ``profiler_vm``, what
the VM runs ``vm_script``, the emulation's reference ``emulation_reference``, the report
``profile_summary``). The rest of the control plane is ``srifty_core.runtime`` until it
moves here (docs/design/README.md)."""
