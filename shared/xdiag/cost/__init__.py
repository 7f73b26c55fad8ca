"""The cost models, in one place: the FLOPs and bytes of the work a profile records. `hlo` costs HLO instructions
from the shapes of the profile's HLO, `custom_calls` the custom calls among them (GEMM, convolution and attention
calls, custom kernels), `library_kernels` JAX's own Pallas kernels from their operands, and `torch_ops` PyTorch
CPU ops from the input shapes a Kineto trace records with them.

The profile readers (xdiag.profile) never call these: they record names and shapes, and the analysis costs them.
"""
