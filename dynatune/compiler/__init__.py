"""Compiling and timing the whole model: compile with the best schedules and verify against ONNX Runtime,
time it side by side (in this process or a fresh one), profile its kernels, and measure it periodically."""
