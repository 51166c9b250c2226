"""Training runtime: runs plans with DDP on real worker processes. Import submodules
(``runtime.worker``) directly; they load torch."""
