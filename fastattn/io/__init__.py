"""Reading and writing weights: safetensors files, PyTorch state dicts."""
