"""The a2v pipeline's audio: the file read as ltx-pipelines reads it, and the log-mel spectrogram its encoder takes.

:func:`read_audio` follows ltx-pipelines @ 400fd310 ``utils/media_io/decode.py::decode_audio_from_file`` (PyAV, every
frame as float in [-1, 1], cut to the video's duration). :func:`log_mel` is ltx-core's
``AudioProcessor.waveform_to_mel`` without torchaudio, which has no wheel for this torch:
``torchaudio.functional.resample`` (windowed sinc, Hann, width 6, roll-off 0.99) and ``MelSpectrogram`` (STFT
magnitude, centred with reflection, periodic Hann window, Slaney mel scale and area normalisation), then
``log(max(mel, 1e-5))`` as ``[batch, channels, time, mels]``. Changes: a mono file is used as two equal channels (the
encoder takes two; ltx-pipelines fails on one), more than two channels are refused, and so is a file shorter than
the video.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import av
import numpy as np
import torch

from deliverykit.errors import InputError

AUDIO_FLAG = "--audio"
LOG_FLOOR = 1e-5  # ltx-core clamps the mel magnitudes before the log
RESAMPLE_WIDTH, RESAMPLE_ROLLOFF = 6, 0.99  # torchaudio.functional.resample's defaults, as ltx-core calls it
ENCODER_CHANNELS = 2
INTEGER_RANGES = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0}  # ltx-pipelines' _INT_FORMAT_MAX


@dataclasses.dataclass(frozen=True)
class AudioClip:
    """``waveform`` float32 ``[2, samples]`` in [-1, 1] at ``sample_rate`` Hz (the a2v video's sound track too), read
    from ``source`` (for the report)."""

    waveform: torch.Tensor
    sample_rate: int
    source: str

    @property
    def seconds(self) -> float:
        return self.waveform.shape[1] / self.sample_rate


def read_audio(path: Path, seconds: float, *, flag: str = AUDIO_FLAG, required: bool = True) -> AudioClip | None:
    """The first ``seconds`` of the audio stream of ``path`` (any file PyAV reads); exit 3 naming what is wrong.

    ``required`` False (a retake's source): None for a file without sound, and a shorter sound is read whole."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{flag} {path} does not exist; pass an audio file (WAV, MP3, FLAC, or a video)")
    try:
        with av.open(str(path)) as container:
            stream = next((stream for stream in container.streams if stream.type == "audio"), None)
            if stream is None and not required:
                return None
            if stream is None:
                raise InputError(f"{flag} {path} has no audio stream; pass a file with sound")
            rate, needed, frames, count, first_time = stream.rate, round(seconds * stream.rate), [], 0, None
            container.seek(0, stream=stream)  # as ltx-pipelines: an AAC decoder started by a seek gives other samples
            for frame in container.decode(stream):
                if count >= needed:  # the rest lies past the video's end
                    break
                time = None if frame.pts is None else float(frame.pts * stream.time_base)
                if time is None or time + frame.samples / frame.sample_rate < 0:  # no time, or before the start
                    continue
                first_time = time if first_time is None else first_time
                frames.append(_frame_samples(frame))
                count += frames[-1].shape[1]
    except av.error.FFmpegError as err:
        raise InputError(f"{flag} {path} is not a readable audio file ({err}); pass WAV, MP3 or FLAC") from None
    waveform = np.concatenate(frames, axis=-1) if frames else np.zeros((1, 0), dtype=np.float32)
    # a codec's first frame may start before 0 (AAC's priming samples): ltx-pipelines cuts what lies before 0
    waveform = waveform[:, max(0, round(-(first_time or 0.0) * rate)) :]
    if waveform.shape[0] > ENCODER_CHANNELS:
        raise InputError(f"{flag} {path} has {waveform.shape[0]} channels; downmix it to stereo or mono")
    if not required and waveform.shape[1] == 0:
        return None
    if required and waveform.shape[1] < needed:
        raise InputError(
            f"{flag} {path} lasts {waveform.shape[1] / rate:.2f} s; the video lasts {seconds:.2f} s: pass a "
            "longer file or fewer --num-frames"
        )
    clip = torch.from_numpy(np.ascontiguousarray(waveform[:, :needed]))
    return AudioClip(clip.expand(ENCODER_CHANNELS, -1).contiguous(), rate, str(path))


def _frame_samples(frame: av.AudioFrame) -> np.ndarray:
    """``[channels, samples]`` float32, as ltx-pipelines' ``_audio_frame_to_float`` (integers divided by their
    format's range; unsigned 8-bit is not re-centred there either)."""
    samples = frame.to_ndarray().astype(np.float32)
    samples = samples / INTEGER_RANGES.get(frame.format.name.rstrip("p"), 1.0)
    if not frame.format.is_planar:  # interleaved: (1, samples · channels)
        samples = samples.reshape(-1, len(frame.layout.channels)).T
    return samples


def log_mel(
    waveform: torch.Tensor, sample_rate: int, *, target_rate: int, n_fft: int, hop: int, mels: int
) -> torch.Tensor:
    """``[batch, channels, frames, mels]`` log-mel spectrogram of ``waveform [batch, channels, samples]``."""
    waveform = resample(waveform, sample_rate, target_rate)
    window = torch.hann_window(n_fft, dtype=waveform.dtype, device=waveform.device)
    flat = waveform.reshape(-1, waveform.shape[-1])
    spectrum = torch.stft(flat, n_fft, hop, n_fft, window, center=True, pad_mode="reflect", return_complex=True)
    filters = mel_filters(n_fft // 2 + 1, target_rate, mels).to(waveform.device, waveform.dtype)
    mel = (spectrum.abs().transpose(1, 2) @ filters).clamp_min(LOG_FLOOR).log()
    return mel.reshape(*waveform.shape[:-1], *mel.shape[1:])


def resample(waveform: torch.Tensor, rate: int, target_rate: int) -> torch.Tensor:
    """``torchaudio.functional.resample(waveform, rate, target_rate)`` (``sinc_interp_hann``, width 6, roll-off
    0.99): one polyphase kernel per output phase, applied as a strided convolution."""
    if rate == target_rate:
        return waveform
    common = math.gcd(rate, target_rate)
    rate, target_rate = rate // common, target_rate // common
    cutoff = min(rate, target_rate) * RESAMPLE_ROLLOFF
    width = math.ceil(RESAMPLE_WIDTH * rate / cutoff)
    dtype, device = waveform.dtype, waveform.device
    taps = torch.arange(-width, width + rate, dtype=dtype, device=device)[None, None] / rate
    t = (torch.arange(0, -target_rate, -1, dtype=dtype, device=device)[:, None, None] / target_rate + taps) * cutoff
    t = t.clamp(-RESAMPLE_WIDTH, RESAMPLE_WIDTH)
    window = torch.cos(t * math.pi / RESAMPLE_WIDTH / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0, dtype=dtype, device=device), t.sin() / t) * window * cutoff / rate
    length = waveform.shape[-1]
    flat = torch.nn.functional.pad(waveform.reshape(-1, 1, length), (width, width + rate))
    out = torch.nn.functional.conv1d(flat, kernels, stride=rate).transpose(1, 2).reshape(flat.shape[0], -1)
    return out[:, : math.ceil(target_rate * length / rate)].reshape(*waveform.shape[:-1], -1)


def mel_filters(frequencies: int, sample_rate: int, mels: int) -> torch.Tensor:
    """``[frequencies, mels]`` triangular filters on the Slaney mel scale from 0 Hz to Nyquist, each normalised to
    unit area (``torchaudio.functional.melscale_fbanks(..., norm="slaney", mel_scale="slaney")``)."""
    bins = torch.linspace(0, sample_rate // 2, frequencies)
    edges = _mel_to_hz(torch.linspace(0.0, _hz_to_mel(sample_rate / 2.0), mels + 2))
    gaps = edges[1:] - edges[:-1]
    slopes = edges.unsqueeze(0) - bins.unsqueeze(1)
    rising, falling = -slopes[:, :-2] / gaps[:-1], slopes[:, 2:] / gaps[1:]
    filters = torch.minimum(rising, falling).clamp_min(0)
    return filters * (2.0 / (edges[2 : mels + 2] - edges[:mels])).unsqueeze(0)


_SLANEY_STEP, _SLANEY_KNEE = 200.0 / 3, 1000.0  # linear below 1 kHz (3 mels per 200 Hz), logarithmic above
_SLANEY_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz < _SLANEY_KNEE:
        return hz / _SLANEY_STEP
    return _SLANEY_KNEE / _SLANEY_STEP + math.log(hz / _SLANEY_KNEE) / _SLANEY_LOG_STEP


def _mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    knee = _SLANEY_KNEE / _SLANEY_STEP
    return torch.where(mel >= knee, _SLANEY_KNEE * torch.exp(_SLANEY_LOG_STEP * (mel - knee)), _SLANEY_STEP * mel)
