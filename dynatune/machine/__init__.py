"""The machine tuned for: its TVM target and its roofline (peak compute and memory bandwidth)."""
