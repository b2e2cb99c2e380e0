"""Importing a model: an ONNX file becomes a Relax IRModule, lowered in a chosen layout and split into
weighted operator tasks with stable keys (cached by content)."""
