"""The a2v sound track (``sulphur2_npu.audio_io``): files read as ltx-pipelines reads them, and the log-mel front end
against float64 NumPy written from the definitions torchaudio documents (windowed-sinc resampling as a direct sum,
framed FFT, Slaney mel filters), and against torchaudio itself where it imports (PyPI has none for this torch; a
torchaudio 2.11 wheel unpacked on PYTHONPATH runs its pure-Python ``resample`` and ``MelSpectrogram``)."""

from __future__ import annotations

import math
import wave

import numpy as np
import pytest
import torch

from deliverykit.errors import InputError
from sulphur2_npu.audio_io import log_mel, read_audio, resample

RATES = [(44_100, 16_000), (48_000, 16_000), (22_050, 16_000), (8_000, 16_000), (16_000, 16_000)]
N_FFT, HOP, MELS, TARGET = 1024, 160, 64, 16_000


def _signal(rate: int, seconds: float = 0.1) -> torch.Tensor:
    """``[1, 2, samples]``: a chord plus a little noise, loud enough that no mel bin nears the log floor."""
    time = torch.arange(round(rate * seconds), dtype=torch.float64) / rate
    noise = torch.randn(2, len(time), generator=torch.Generator().manual_seed(rate), dtype=torch.float64)
    chord = torch.stack([torch.sin(2 * math.pi * 440 * time), torch.sin(2 * math.pi * 1250 * time)])
    return (0.5 * chord + 0.05 * noise).unsqueeze(0).float()


def _resample_reference(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Each output sample as the windowed-sinc sum over the zero-extended input (width 6 zero crossings of the
    cutoff ``0.99 · min(rate, target)``, Hann window), times in units of the rates' greatest common divisor; at
    equal rates the input itself (torchaudio returns it unfiltered)."""
    if rate == target:
        return x.astype(np.float64)
    common = math.gcd(rate, target)
    rate, target = rate // common, target // common
    cutoff = 0.99 * min(rate, target)
    length = math.ceil(target * x.shape[-1] / rate)
    t = (np.arange(x.shape[-1])[None, :] / rate - np.arange(length)[:, None] / target) * cutoff
    window = np.where(np.abs(t) <= 6, np.cos(np.pi * t / 12) ** 2, 0.0)
    kernel = np.sinc(t) * window * cutoff / rate
    return x.astype(np.float64) @ kernel.T


def _log_mel_reference(x: np.ndarray, rate: int) -> np.ndarray:
    """Reflect-padded frames of ``N_FFT`` every ``HOP`` under a periodic Hann window, |rFFT|, Slaney mel filters of
    unit area from 0 Hz to Nyquist, ``log(max(·, 1e-5))``: ``[..., frames, MELS]``."""
    y = _resample_reference(x, rate, TARGET)
    padded = np.pad(y, [(0, 0)] * (y.ndim - 1) + [(N_FFT // 2, N_FFT // 2)], mode="reflect")
    count = 1 + (padded.shape[-1] - N_FFT) // HOP
    frames = np.stack([padded[..., i * HOP : i * HOP + N_FFT] for i in range(count)], axis=-2)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    magnitude = np.abs(np.fft.rfft(frames * window, axis=-1))

    def hz_to_mel(hz):
        return np.where(hz < 1000, hz * 3 / 200, 15 + np.log(np.maximum(hz, 1e-9) / 1000) * 27 / np.log(6.4))

    def mel_to_hz(mel):
        return np.where(mel < 15, mel * 200 / 3, 1000 * np.exp((mel - 15) * np.log(6.4) / 27))

    edges = mel_to_hz(np.linspace(0, hz_to_mel(TARGET / 2), MELS + 2))
    bins = np.linspace(0, TARGET // 2, N_FFT // 2 + 1)
    rising = (bins[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[None, 2:] - bins[:, None]) / (edges[2:] - edges[1:-1])
    filters = np.maximum(0, np.minimum(rising, falling)) * (2 / (edges[2:] - edges[:-2]))
    return np.log(np.maximum(magnitude @ filters, 1e-5))


@pytest.mark.parametrize(("rate", "target"), RATES)
def test_resample_is_the_windowed_sinc_sum(rate, target):
    x = _signal(rate)
    got = resample(x, rate, target)
    reference = _resample_reference(x.numpy(), rate, target)
    assert got.shape == reference.shape
    # a float32 kernel and sums of up to 2 · 17 + 441 taps (44.1 kHz) of values below 1
    np.testing.assert_allclose(got.numpy(), reference, rtol=0, atol=2e-5)


@pytest.mark.parametrize("rate", [rate for rate, _ in RATES])
def test_log_mel_is_the_documented_spectrogram(rate):
    x = _signal(rate)
    got = log_mel(x, rate, target_rate=TARGET, n_fft=N_FFT, hop=HOP, mels=MELS)
    reference = _log_mel_reference(x.numpy(), rate)
    assert got.shape == reference.shape == (1, 2, 11, MELS)
    _assert_close_mels(got.numpy(), reference)


def _assert_close_mels(got: np.ndarray, reference: np.ndarray) -> None:
    """Equal as magnitudes to float32 rounding of the FFT sums (1e-4 of the peak): in log units an empty band (above
    the Nyquist of an 8 kHz file) would magnify the rounding of values near the 1e-5 floor."""
    np.testing.assert_allclose(np.exp(got), np.exp(reference), rtol=1e-4, atol=1e-4 * np.exp(reference).max())


@pytest.mark.parametrize("rate", [rate for rate, _ in RATES])
def test_log_mel_equals_torchaudio_where_it_imports(rate):
    torchaudio = pytest.importorskip("torchaudio", reason="no torchaudio for this torch on PyPI (see the module)")
    if not hasattr(torchaudio, "transforms"):
        pytest.skip("torchaudio is the ltx-core peer's empty stand-in here")
    x = _signal(rate)
    mel = torchaudio.transforms.MelSpectrogram(
        sample_rate=TARGET, n_fft=N_FFT, win_length=N_FFT, hop_length=HOP, f_min=0.0, f_max=TARGET / 2,
        n_mels=MELS, window_fn=torch.hann_window, center=True, pad_mode="reflect", power=1.0, mel_scale="slaney",
        norm="slaney",
    )(torchaudio.functional.resample(x, rate, TARGET))  # fmt: skip
    reference = mel.clamp_min(1e-5).log().permute(0, 1, 3, 2)  # ltx-core AudioProcessor.waveform_to_mel
    got = log_mel(x, rate, target_rate=TARGET, n_fft=N_FFT, hop=HOP, mels=MELS)
    assert got.shape == reference.shape
    _assert_close_mels(got.numpy(), reference.numpy())


def _wav(path, samples: np.ndarray, rate: int) -> None:
    """``samples`` ``[channels, n]`` int16 as a PCM WAV (the standard library's writer, not PyAV)."""
    with wave.open(str(path), "wb") as file:
        file.setnchannels(samples.shape[0])
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(samples.T.astype("<i2").tobytes())


def test_a_mono_wav_is_read_exactly_cut_to_the_video_and_doubled(tmp_path):
    samples = np.random.default_rng(0).integers(-32768, 32767, (1, 9000), dtype=np.int16)
    _wav(tmp_path / "mono.wav", samples, 22_050)
    clip = read_audio(tmp_path / "mono.wav", seconds=0.25)
    assert clip.sample_rate == 22_050 and clip.waveform.shape == (2, round(0.25 * 22_050))
    expected = torch.from_numpy(samples[0, : clip.waveform.shape[1]] / 32768.0).float()
    assert torch.equal(clip.waveform[0], expected) and torch.equal(clip.waveform[1], expected)
    assert clip.source == str(tmp_path / "mono.wav")


def test_stereo_channels_keep_their_order(tmp_path):
    samples = np.stack([np.full(4000, 1000, np.int16), np.full(4000, -2000, np.int16)])
    _wav(tmp_path / "stereo.wav", samples, 16_000)
    clip = read_audio(tmp_path / "stereo.wav", seconds=0.2)
    assert torch.equal(clip.waveform[:, 0], torch.tensor([1000 / 32768, -2000 / 32768]))


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("absent.wav", "does not exist"),
        ("text.wav", "is not a readable audio file"),
        ("short.wav", "lasts 0.10 s; the video lasts 0.25 s"),
        ("surround.wav", "has 3 channels; downmix it"),
    ],
)
def test_bad_sound_tracks_are_input_errors_naming_the_file(tmp_path, name, says):
    (tmp_path / "text.wav").write_text("not audio")
    _wav(tmp_path / "short.wav", np.zeros((1, 1600), np.int16), 16_000)
    _wav(tmp_path / "surround.wav", np.zeros((3, 8000), np.int16), 16_000)
    with pytest.raises(InputError, match=says) as refused:
        read_audio(tmp_path / name, seconds=0.25)
    assert str(refused.value).startswith(f"--audio {tmp_path / name}")
