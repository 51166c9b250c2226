"""Training runtime: runs plans with DDP on real worker processes. Import submodules
(``runtime.measure``) directly; they load torch."""
