"""Benchmarks: scripts that print figures (``python -m bench.NAME``; see README "Benchmarks"). Beam's warning of
the optional GCP libraries is left out, as the command line leaves it out."""

from pipelines.launcher.worker_output import leave_out_optional_gcp_warning

leave_out_optional_gcp_warning()
