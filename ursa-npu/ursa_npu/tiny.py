"""A tiny URSA with seeded random weights, in the real folder layout, for smoke runs and tests without weights.

Architecture-faithful: the real ``URSATransformer3DModel`` (a 2-layer Qwen3 decoder, 4 query / 2 KV heads, so
grouped-query attention runs), the real ``AutoencoderVQ`` with a 64-entry VQ codebook, the real
``KineticOptimalScheduler`` with a metric path over that codebook, and a word-level tokenizer built here. It is
written with the patched ``save_pretrained`` (``model_index.json``, ``transformer/``, ``vae/``, ``scheduler/`` with
``scheduler_model.pth``, ``tokenizer/``) and is meant to be read back through the same loader as real weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from deliverykit.random_weights import randomize_

RANDOM_WEIGHTS_MARKER = "RANDOM_WEIGHTS.txt"  # the loader reads it: reports then say "random weights"
SMOKE_STEPS = 4  # a few steps: seconds on a CPU


# Words the tokenizer knows; anything else maps to <unk>. Ids: <pad> 0, <unk> 1, <bov> 2, then these.
WORDS = tuple(
    [
        "a",
        "photo",
        "of",
        "the",
        "cat",
        "dog",
        "on",
        "red",
        "blue",
        "green",
        "small",
        "big",
        "mountain",
        "lake",
        "under",
        "sky",
        "with",
        "sun",
        "tree",
        "house",
        "in",
        "and",
    ]
)
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bov>")
CODEBOOK_SIZE = 64


@dataclass(frozen=True)
class TinyVariant:
    """Image size, VQ stride (one 2x down/up-sampling per extra VAE block) and prompt length of a tiny URSA."""

    size: int
    vae_blocks: int
    max_prompt_length: int

    @property
    def spatial_stride(self) -> int:
        return 2 ** (self.vae_blocks - 1)


# "tiny": a 16x16 token grid for tests (seconds on a CPU). "tiny512": the real model's sequence shape, 512x512
# pixels through a stride-16 VQ (32x32 = 1024 image tokens) after a 320-token prompt, for benchmarks.
VARIANTS = {"tiny": TinyVariant(32, 2, 16), "tiny512": TinyVariant(512, 5, 320)}

TRANSFORMER_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "rope_theta": 1000000,
    "lm_head_size": CODEBOOK_SIZE,
    "bov_token_id": 2,
}
SCHEDULER_CONFIG = {"alpha": 0.9, "c": 3.0, "shift": 1.0}  # arbitrary but valid metric-path parameters


def vae_config(variant: TinyVariant) -> dict[str, object]:
    return {
        "block_out_channels": (32,) * variant.vae_blocks,  # multiples of 32: autoencoder_kl has GroupNorm(32, ...)
        "down_block_types": ("DownEncoderBlock2D",) * variant.vae_blocks,
        "up_block_types": ("UpDecoderBlock2D",) * variant.vae_blocks,
        "layers_per_block": 1,
        "latent_channels": 4,
        "num_vq_embeddings": CODEBOOK_SIZE,
        "vq_embed_dim": 4,
        "spatial_stride": variant.spatial_stride,
        "temporal_stride": 1,
        "sample_size": variant.size,
    }


def build_tokenizer():
    """A word-level fast tokenizer (``tokenizers`` + ``PreTrainedTokenizerFast``), no download needed."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *WORDS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")


def write_tiny_weights(root: str | os.PathLike, classes: SimpleNamespace, variant: str = "tiny", seed: int = 0) -> Path:
    """Write a tiny URSA under ``root/URSA-<variant>`` and return that folder (the ``--weights`` of a smoke run).

    ``classes`` comes from :func:`ursa_npu.upstream.import_diffnext`. The scheduler goes through its own loader
    first (config + codebook file), so the pipeline holds exactly what ``from_pretrained`` builds.
    """
    from . import hooks  # torch: imported with the model, not with VARIANTS

    folder = Path(root) / f"URSA-{variant}"
    tokenizer = build_tokenizer()
    lm_vocab_size = len(tokenizer)
    transformer = classes.transformer(
        **TRANSFORMER_CONFIG, lm_vocab_size=lm_vocab_size, vocab_size=lm_vocab_size + CODEBOOK_SIZE
    )
    vae = classes.vae(**vae_config(VARIANTS[variant]))
    # Bit-identical on every torch version, whatever torch's random stream: numpy's PCG64 per tensor name.
    randomize_(transformer, seed)
    randomize_(vae, seed)
    scheduler_dir = folder / "scheduler"
    classes.scheduler(**SCHEDULER_CONFIG).save_config(scheduler_dir)
    hooks.save_codebook(scheduler_dir, vae.quantizer.embedding.weight)
    scheduler = classes.scheduler.from_pretrained(scheduler_dir)
    pipe = classes.pipeline(transformer=transformer, scheduler=scheduler, vae=vae, tokenizer=tokenizer)
    pipe.save_pretrained(folder)
    (folder / RANDOM_WEIGHTS_MARKER).write_text("seeded random weights written by ursa_npu.tiny, not a trained model\n")
    return folder
