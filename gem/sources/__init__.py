"""Sources of landing events: the synthetic world and its simulation, and MovieLens."""
