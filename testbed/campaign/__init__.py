"""What to run: campaign files and presets (``parse``), the campaign model (``campaign``),
the allowed values of every field (``vocabulary``) and seeded workloads (``workload``)."""
