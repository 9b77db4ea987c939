"""The simulated CUDA driver (simdriver.c, built into libcuda.so.1 here); see cyctx.testing."""
