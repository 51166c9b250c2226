"""The control plane (no torch at import): a job planned (``planning``, ``job``), its
VMs provisioned and its workers started (``provisioning``, ``artifact``, ``launch`` is the
worker side's), watched (``monitor_step``, ``monitor_loop``, ``monitor``,
``recalibration``, ``cloud_watch``), re-planned (``replanner``, ``child_run``) and logged
(``job_log``, ``decisions``, ``outcome``); whole jobs in one process (``job_run``,
``local_run``, ``emulated_job``) and the steps the plan-and-train DAG calls
(``orchestrate``); profiling on one cloud VM per offered GPU type (``profile_vms`` and its
``cloud_request``, ``profiler_vm``, ``vm_script``, ``emulation_reference``,
``profile_summary``). What runs on the VMs is ``srifty_core.worker``."""
