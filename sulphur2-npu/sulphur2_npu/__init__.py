"""Sulphur-2-base (LTX-2.3 fine-tune) text/image-to-video + audio on diffusers 0.42.1 and Ascend NPUs."""

MODEL_ID = "SulphurAI/Sulphur-2-base"
