# CUDA benchmark programs
