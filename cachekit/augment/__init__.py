"""Read-time augmentation: transform descriptions, the compiled plan and its draws, pixel kernels, the device stage."""
