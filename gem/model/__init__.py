"""The dense models (Kunlun and the baselines): pure torch, no torchrec, so they also run where
fbgemm is unavailable. Ops (gem/model/ops) each have a plain reference implementation and parity tests."""
