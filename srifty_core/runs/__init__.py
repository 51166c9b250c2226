"""The run folder, below the jobs that write it and the cloud that ships it: its storage at
a path or an fsspec URI (``runs.store``), the progress log and state file
(``runs.progress``) and the timeline plot (``runs.timeline``). Imports only the base
modules (paths, errors, atomic, plotting); no torch."""
