"""Fault drills: the pipeline's jobs killed mid-run, checked, rerun and compared (`python -m drills.faults`)."""
