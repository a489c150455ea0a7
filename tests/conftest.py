import torch

# The tiny models are far too small for threads to help, and on a busy 2-core machine
# spinning worker threads make them many times slower.
torch.set_num_threads(1)
