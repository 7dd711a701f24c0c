"""GEM: an open, runnable Generative Ads Model pipeline (package root)."""
