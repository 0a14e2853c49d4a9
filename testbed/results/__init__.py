"""What a run leaves: the result columns (``schema``), the crash-safe run directory
(``rundir``, ``atomic``), its provenance (``provenance``) and the one-screen summary
(``summary``). Reports (``testbed.report``) only read what these write."""
