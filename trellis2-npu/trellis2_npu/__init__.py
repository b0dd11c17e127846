"""TRELLIS.2-4B on Ascend NPU without CUDA extensions: model-specific code of the trellis2-npu delivery."""
