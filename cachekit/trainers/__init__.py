"""cachekit's loader in the trainers people use: PyTorch Lightning (``trainers.lightning``) and Hugging
Face Accelerate (``trainers.accelerate``), each an extra (``pip install 'cachekit-vision[lightning]'``),
imported only when its module is."""
