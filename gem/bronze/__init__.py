"""Bronze transforms: pure DataFrame functions that turn landed event lines into bronze.ad_events
rows and quarantined lines; jobs/ingest_events.py reads the landing files, calls these and commits."""
