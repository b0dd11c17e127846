"""The video VAE's tiled decode split over the ranks of a multi-card run: each rank decodes every N-th tile.

diffusers 0.42.1 ``AutoencoderKLLTX2Video.tiled_decode`` (on when the memory plan tiles the decode) calls the
decoder once per overlapping spatial tile, then blends the tiles. :func:`split_tiled_decode` runs that method twice
around ``deliverykit.distributed.RoundRobinCalls``: in the first run the decoder computes this rank's tiles and
hands back empty stand-ins (the blend of empty tiles costs nothing); the tiles are broadcast from their ranks; in the
second run the decoder returns the gathered tiles in order, so diffusers' own blend makes the one-process tiled
result on every rank. Without tiling the decode is one decoder call, which every rank makes whole (README "Several
cards": why that is kept).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from deliverykit.distributed import RoundRobinCalls


def _empty_tile(z: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return z.new_empty((z.shape[0], 0, 0, 0, 0))  # [B, C, F, H, W]: the blend's slices and cats accept it


@contextlib.contextmanager
def _decoder_forward(decoder: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """``decoder``'s calls go to ``forward`` (an instance attribute, as diffusers' hooks set one; restored after)."""
    previous = decoder.__dict__.get("forward")
    decoder.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del decoder.forward
        else:
            decoder.forward = previous


def split_tiled_decode(vae: torch.nn.Module, *, rank: int, world_size: int, device: torch.device) -> None:
    """From now on ``vae``'s tiled decode splits its tiles over the ``world_size`` ranks (every rank calls it)."""
    tiled = vae.tiled_decode  # diffusers' bound method

    def tiled_decode(z: torch.Tensor, temb: torch.Tensor | None, causal: bool | None = None, return_dict: bool = True):
        calls = RoundRobinCalls(rank, world_size)
        with _decoder_forward(vae.decoder, calls.record(vae.decoder.forward, _empty_tile)):
            tiled(z, temb, causal=causal, return_dict=False)
        calls.exchange(device)
        with _decoder_forward(vae.decoder, calls.replay()):
            return tiled(z, temb, causal=causal, return_dict=return_dict)

    vae.tiled_decode = tiled_decode
